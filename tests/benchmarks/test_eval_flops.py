"""benchmarks/eval_flops.py over a hand-made comparison folder: the matmul rate is timed in the
comparison's own weight precision, the achieved rate follows the documented formula, and a precision
no comparison writes is refused by name."""
import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "eval_flops.py"


def _comparison(folder: Path, weights: str) -> None:
    folder.mkdir()
    (folder / "compare.json").write_text(json.dumps({"rows": {"direct": {"seconds_per_q": 0.5}}, "weights": weights}))
    rows = [{"token_ids": list(range(30)), "action_mask": [0] * 20 + [1] * 10},
            {"token_ids": list(range(10)), "action_mask": [0] * 6 + [1] * 4}]
    (folder / "trajectories_direct.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def _run(folder: Path, out: Path):
    return subprocess.run([sys.executable, str(SCRIPT), str(folder), "--sizes", "64,128", "--repeats", "2",
                           "--out", str(out)], capture_output=True, text=True, timeout=300)


def test_a_bfloat16_comparison_is_measured_against_the_bfloat16_matmul_rate(tmp_path):
    _comparison(tmp_path / "cmp", "bfloat16")
    proc = _run(tmp_path / "cmp", tmp_path / "flops.json")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    result = json.loads((tmp_path / "flops.json").read_text())
    assert result["weights"] == "bfloat16" and "bfloat16 matmul on" in proc.stdout
    assert set(result["matmul_gflops"]) == {"64", "128"} and result["matmul_peak_gflops"] > 0
    s = result["systems"]["direct"]
    assert (s["questions"], s["tokens_processed"], s["tokens_generated"], s["wall_s"]) == (2, 40, 14, 1.0)
    expected = (2 * result["body_parameters"] * 40 + 2 * result["vocabulary_projection_parameters"] * 14) / 1.0 / 1e9
    assert abs(s["achieved_gflops"] - expected) < 1e-6
    assert abs(s["share_of_matmul_rate"] - expected / result["matmul_peak_gflops"]) < 1e-9


def test_weights_no_comparison_writes_are_refused_before_any_timing(tmp_path):
    _comparison(tmp_path / "cmp", "float16")
    proc = _run(tmp_path / "cmp", tmp_path / "flops.json")
    assert proc.returncode != 0 and "compare.json's weights must be one of float32, bfloat16" in proc.stderr
    assert "matmul on" not in proc.stdout and not (tmp_path / "flops.json").exists()
