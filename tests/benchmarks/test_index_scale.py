"""benchmarks/index_scale.py at a small size, end to end: the synthetic corpus, a streamed BM25 build and
a compressed dense build in processes of their own, recall recorded, and QPS in-process and over HTTP."""
import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "index_scale.py"


def test_the_scale_benchmark_runs_and_reports_every_figure(tmp_path):
    out = tmp_path / "scale.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--passages", "3000", "--kinds", "bm25,ivf_sq8",
                           "--requests", "40", "--recall-queries", "100", "--work", str(tmp_path / "work"),
                           "--out", str(out)], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    corpus = [json.loads(line) for line in open(result["corpus"]["path"], encoding="utf-8")]
    assert len(corpus) == 3000 and len({r["text"] for r in corpus}) == 3000   # perturbed: no two rows alike
    bm25, sq8 = result["builds"]["bm25"], result["builds"]["ivf_sq8"]
    assert bm25["seconds"] > 0 and bm25["peak_rss_mb"] > 50 and bm25["disk_mb"] > 0
    for build in (bm25, sq8):   # the anonymous part of the resident memory: sampled, so a real figure
        assert 10 < build["peak_anon_mb"] <= build["peak_rss_mb"]
    assert sq8["params"]["index"] == "ivf_sq8" and 0.5 < sq8["params"]["recall_at_10"]["recall"] <= 1
    for kind in ("bm25", "ivf_sq8"):
        serving = result["serving"][kind]
        assert serving["inprocess"]["batched_qps"] > 0
        assert set(serving["http"]) == {"1", "64"} and all(v["qps"] > 0 for v in serving["http"].values())
    assert result["projection_21m"]["bm25"]["disk_gb"] > 0 and result["encoder"]["passages_per_s"] > 0
