"""A stranger with only the project: a clone of it in a folder with no `shared/` above it and no
$RAGRL_DATA, installed as the README says (./install.sh), verifies its data kit, checks the main
job's recipe, and runs the main job in a shortened form twice, the second time beside a process that
keeps a core busy (with the suite's other worker on the other, every core is loaded): the two tables
are identical, wall times aside (RL trains a fixed number of steps; the time bound is only a safety).

It clones the checkout's HEAD (commit before running it by hand); CI runs it on the commit it tests."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHORT = ["--held-out", "3", "--set", "steps=3", "--set", "eval_every=3", "--set", "data.eval_n=10",
         "--set", "retriever.filter_questions=false"]
WALL_TIME_KEYS = ("minutes", "retrieval_wall_s")


def run(cmd, cwd, env, timeout=900) -> subprocess.CompletedProcess:
    out = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, f"{cmd} failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out


def without_wall_times(x, out_dir: str):
    """The report with its wall-time fields dropped and the run's own folder (`out_dir`, as given on
    the command line) named the same way."""
    if isinstance(x, dict):
        return {k: without_wall_times(v, out_dir) for k, v in x.items() if k not in WALL_TIME_KEYS}
    if isinstance(x, list):
        return [without_wall_times(v, out_dir) for v in x]
    return x.replace(out_dir, "OUT") if isinstance(x, str) else x


def metric_rows(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    timed = ("time", "tokens_per_s")   # and time/*, eval/retrieval_wall_s: wall clock, not figures
    return [{k: v for k, v in r.items() if not (k in timed or k.startswith("time/") or k.endswith("wall_s"))}
            for r in rows]


@pytest.mark.slow
def test_a_fresh_clone_installs_verifies_its_kit_and_gives_the_same_table_under_load(tmp_path):
    assert not any((d / "shared").exists() for d in (tmp_path, *tmp_path.parents))
    clone = tmp_path / "ragrl"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True, timeout=300)
    env = {k: v for k, v in os.environ.items() if k not in ("RAGRL_DATA", "VIRTUAL_ENV", "PYTHONPATH")}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if ".venv" not in p)
    env["PYTHON"] = sys.executable if sys.prefix == sys.base_prefix else str(Path(sys.base_prefix) / "bin" / "python3")
    env["OMP_NUM_THREADS"] = "1"
    run(["./install.sh"], clone, env, timeout=1500)
    ragrl = str(clone / ".venv" / "bin" / "ragrl")

    kit = run([ragrl, "data"], clone, env).stdout.splitlines()
    assert str(clone / ".venv") in kit[0] and kit[-1].startswith("18 of 18 files verified by sha256")
    check = run([ragrl, "train", "harr_grpo", "--variant", "tiny", "--check"], clone, env).stdout
    assert "nothing was trained" in check and "18 files verified" in check and "dense index: 51185 passages" in check

    reports = []
    for name, load in (("idle", 0), ("loaded", 1)):
        hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(load)]
        try:
            out = run([ragrl, "quickstart", *SHORT, "--out", f"runs/{name}"], clone, env)
        finally:
            for hog in hogs:
                hog.kill()
        assert "WALL-TIME BOUND" not in out.stdout + out.stderr
        report = json.loads((clone / "runs" / name / "before_after.json").read_text())
        assert report["settings"]["steps_trained"] == 3 and not report["settings"]["cut_by_time_bound"]
        reports.append((without_wall_times(report, f"runs/{name}"),
                        metric_rows(clone / "runs" / name / "rl"),
                        (clone / "runs" / name / "before_after.md").read_text().replace(f"runs/{name}", "OUT")))
    (idle, idle_rows, idle_md), (loaded, loaded_rows, loaded_md) = reports
    assert set(idle["sets"]) == {"hotpotqa_dev", "musique_dev", "2wikimultihopqa_dev"}
    assert idle["pooled"]["base encoder"]["n"] == 9
    assert idle == loaded and idle_rows == loaded_rows and idle_md == loaded_md
