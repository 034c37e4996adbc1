"""benchmarks/soak.py's quick setting, end to end: a real run (the real CLI in its own process, a real
`ragrl serve` over HTTP) meets 8 faults of 7 kinds at seeded random moments and must come out with the
metrics rows, kept artifacts and weights of the same run uninterrupted."""
import json
import subprocess
import sys
from pathlib import Path

SOAK = Path(__file__).resolve().parents[2] / "benchmarks" / "soak.py"


def test_the_quick_soak_survives_every_fault_and_ends_equal_to_the_uninterrupted_run(tmp_path):
    out = tmp_path / "soak.json"
    proc = subprocess.run([sys.executable, str(SOAK), "--setting", "quick", "--out", str(out),
                           "--keep", str(tmp_path / "runs")], capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    result = json.loads(out.read_text())
    summary, faults = result["summary"], result["faults"]
    assert summary["passed"] and summary["metrics_equal"] and summary["rows"] == summary["reference_rows"] == 12
    assert summary["artifacts"]["equal"] and summary["artifacts"]["files"] > 20
    assert summary["weights"]["equal"] and summary["weights"]["files"] >= 3
    assert summary["faults"] == len(faults) == 8 and summary["kinds"] >= 5
    assert all(f["survived"] and f["steps_lost"] == 0 for f in faults)
    assert {"trainer_killed", "checkpoint_damaged", "disk_full", "server_outage", "nan_loss"} <= {f["fault"] for f in faults}
    # The faults were really met: a stop per relaunching fault, each NaN step's update skipped.
    assert summary["launches"] >= 1 + sum(f["fault"] in ("trainer_killed", "checkpoint_damaged", "disk_full",
                                                           "server_outage") for f in faults)
    by_kind = {f["fault"]: f for f in faults}
    assert "exit 74" in by_kind["disk_full"]["did"] and "MiB free" in by_kind["disk_full"]["did"]
    assert "exit 75" in by_kind["server_outage"]["did"]
    assert "is damaged" in by_kind["checkpoint_damaged"]["did"]
    rows = [json.loads(ln) for ln in (tmp_path / "runs" / "soak" / "metrics.jsonl").read_text().splitlines()]
    assert all(rows[s]["guard/nonfinite_skipped"] > 0 for s in result["nan_steps"])
