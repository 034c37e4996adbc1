"""`ragrl train` killed with SIGKILL and restarted with --resume reproduces the uninterrupted run.

Every run is the real CLI in a subprocess (tiny random Llama, BM25 over a 200-passage corpus,
6 questions, 2 questions × 2 samples per step, 2 turns of 16 tokens). The random model never
answers, so rewards are 0; an entropy bonus and a KL term make the weights, and so the logged
losses/KL/grad norms, move every step and depend on the step's questions. The uninterrupted
reference runs 4 steps = 1⅓ epochs.
"""
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ragrl.datasets import load_questions
from ragrl.train.checkpoint import latest_checkpoint
from ragrl.train.run_dir import read_metrics

HERE = Path(__file__).resolve().parent
N_QUESTIONS, PER_STEP = 6, 2   # an epoch is 3 steps
SKIP_KEYS = {"time", "tokens_per_s"}


@pytest.fixture(scope="module")
def env(tmp_path_factory, tiny_model_dir):
    """Data files, a private RAGRL_HOME (BM25 index cache) and the common --set overrides."""
    root = tmp_path_factory.mktemp("resume")
    write_jsonl(root / "train.jsonl", load_questions("demo-train")[:N_QUESTIONS])
    write_jsonl(root / "eval.jsonl", load_questions("demo-eval")[:2])
    from ragrl.paths import DEMO_CORPUS
    from ragrl.retrieval.corpus import load_corpus

    corpus = load_corpus(DEMO_CORPUS)
    write_jsonl(root / "corpus.jsonl", [{"id": corpus.ids[i], "title": corpus.titles[i], "text": corpus.texts[i]}
                                        for i in range(200)])
    sets = {
        "model.name": tiny_model_dir, "questions_per_step": PER_STEP, "rollout.n": 2, "rollout.max_turns": 2,
        "rollout.max_turn_tokens": 16, "rollout.max_response_tokens": 64, "sft.steps": 0, "eval_every": 0,
        "data.train": root / "train.jsonl", "data.eval": root / "eval.jsonl", "data.corpus": root / "corpus.jsonl",
        "lr": 0.01, "algo.entropy_coef": 0.01, "algo.kl_coef": 0.05, "seed": 5,
    }
    proc_env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "RAGRL_HOME": str(root / "home")}
    return {"root": root, "sets": sets, "env": proc_env}


def write_jsonl(path: Path, rows) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def start(env, out: Path, *, steps: int, save_every: int, resume=False, worker=False, extra_env=None):
    sets = {**env["sets"], "out_dir": out, "steps": steps, "save_every": save_every}
    entry = [str(HERE / "train_worker.py")] if worker else ["-m", "ragrl.cli.main"]
    cmd = [sys.executable, *entry, "train", "search_r1_grpo", "--variant", "tiny"]
    cmd += [a for k, v in sets.items() for a in ("--set", f"{k}={v}")] + (["--resume"] if resume else [])
    out.mkdir(parents=True, exist_ok=True)
    log_path = out.parent / f"{out.name}.{'resume' if resume else 'run'}.log"
    with open(log_path, "a") as log:
        # Own session: SIGKILL goes to the whole process group, like a node losing power.
        proc = subprocess.Popen(cmd, env={**env["env"], **(extra_env or {})}, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
    proc.log_path = log_path
    return proc


def finish(proc, timeout=300) -> None:
    try:
        rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    assert rc == 0, f"ragrl train failed with {rc}:\n{proc.log_path.read_text()[-3000:]}"


def run(env, out, **kw) -> list[dict]:
    proc = start(env, out, **kw)
    finish(proc)
    return read_metrics(out)


def kill_when(proc, condition, timeout=300) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert proc.poll() is None, f"the run ended (rc {proc.returncode}) before the kill point"
        assert time.monotonic() < deadline, "timed out waiting for the kill point"
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGKILL)
    assert proc.wait(timeout=60) == -signal.SIGKILL


def assert_same_rows(got: list[dict], want: list[dict]) -> None:
    assert [r["step"] for r in got] == [r["step"] for r in want]
    for g, w in zip(got, want):
        keys = {k for k in w if k not in SKIP_KEYS and not k.startswith("time/")}
        assert keys <= set(g), f"step {w['step']}: missing {keys - set(g)}"
        bad = {k: (g[k], w[k]) for k in keys if not math.isclose(g[k], w[k], rel_tol=1e-4, abs_tol=1e-7)}
        assert not bad, f"step {w['step']} differs: {bad}"


def marker(out: Path) -> str:
    return latest_checkpoint(out).name


@pytest.fixture(scope="module")
def reference(env):
    """The uninterrupted run: 4 steps, checkpoints at 2 and 4."""
    rows = run(env, env["root"] / "clean", steps=4, save_every=2)
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    # the metrics move from step to step (else equal rows would prove nothing)
    assert len({round(r["kl_ref"], 7) for r in rows[1:]}) == 3 and rows[3]["kl_ref"] > 0
    return rows


def test_sigkill_mid_run_then_resume_matches_the_uninterrupted_run(env, reference):
    out = env["root"] / "killed"
    proc = start(env, out, steps=4, save_every=2)
    # Kill after step 2 was logged but before checkpoint 4: step 2 must be replayed, not duplicated.
    kill_when(proc, lambda: len(read_metrics(out)) >= 3)
    assert marker(out) == "step_000002", "the kill came too late to test anything"
    assert len(read_metrics(out)) in (3, 4)  # rows past the checkpoint, to be replaced on resume
    rows = run(env, out, steps=4, save_every=2, resume=True)
    assert_same_rows(rows, reference)
    assert "resumed from step_000002 at step 2" in (out / "train.log").read_text()


def test_sigterm_mid_run_records_the_stage_then_resume_matches_the_uninterrupted_run(env, reference):
    """`kill` (SIGTERM) is a stop, not a crash: the run exits 143 after its `finally` blocks ran, so
    its training.json holds the RL stage it had run, and --resume gives the reference's rows."""
    out = env["root"] / "terminated"
    proc = start(env, out, steps=4, save_every=1)
    deadline = time.monotonic() + 300
    while len(read_metrics(out)) < 2:
        assert proc.poll() is None, f"the run ended (rc {proc.returncode}) before the stop point"
        assert time.monotonic() < deadline, "timed out waiting for the stop point"
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=120) == 143, proc.log_path.read_text()[-3000:]
    assert "stopped (SIGTERM)" in proc.log_path.read_text()
    [stage] = json.loads((out / "training.json").read_text())["stages"]
    assert stage["stage"] == "rl" and stage["seconds"] > 0
    rows = run(env, out, steps=4, save_every=1, resume=True)
    assert_same_rows(rows, reference)
    assert [s["stage"] for s in json.loads((out / "training.json").read_text())["stages"]] == ["rl", "rl"]


def test_sigkill_during_checkpoint_write_keeps_the_previous_checkpoint(env, reference):
    out, ready = env["root"] / "ckpt_kill", env["root"] / "ckpt_kill.ready"
    proc = start(env, out, steps=2, save_every=1, worker=True,
                 extra_env={"RAGRL_TEST_HANG_AT_CHECKPOINT": "2", "RAGRL_TEST_READY": str(ready)})
    kill_when(proc, ready.exists)
    ckpts = out / "checkpoints"
    assert marker(out) == "step_000001" and (ckpts / "latest").read_text().strip() == "step_000001"
    assert (ckpts / ".tmp_step_000002" / "trainer_state.json").exists()  # complete, just not published
    assert not (ckpts / "step_000002").exists()
    assert len(read_metrics(out)) == 2  # step 1 was logged before its checkpoint started
    rows = run(env, out, steps=2, save_every=1, resume=True)
    assert_same_rows(rows, reference[:2])
    assert "resumed from step_000001 at step 1" in (out / "train.log").read_text()
    assert marker(out) == "step_000002" and not list(ckpts.glob(".tmp_*"))


def test_resume_exactly_at_an_epoch_boundary_continues_the_data_order(env, reference):
    out = env["root"] / "epoch"
    first = run(env, out, steps=N_QUESTIONS // PER_STEP, save_every=1)   # ends with epoch 1
    assert marker(out) == "step_000003" and len(first) == 3
    rows = run(env, out, steps=4, save_every=1, resume=True)            # step 3 opens epoch 2
    assert_same_rows(rows, reference)
    assert marker(out) == "step_000004"


def test_disk_full_during_a_checkpoint_stops_the_run_and_resume_matches_the_uninterrupted_run(env, reference):
    """Checkpoint 2's optimizer.pt is cut short by ENOSPC (injected at the file layer): the run stops
    with exit 74 naming the path and the free space, checkpoint 1 stays the newest and intact, and
    --resume (space freed: the fault is gone) gives the reference's rows."""
    out = env["root"] / "disk_full"
    proc = start(env, out, steps=3, save_every=1, worker=True,
                 extra_env={"RAGRL_TEST_DISK_FULL_AT_CHECKPOINT": "2"})
    assert proc.wait(timeout=300) == 74, proc.log_path.read_text()[-3000:]
    log = proc.log_path.read_text()
    assert "could not write checkpoint step 2 to" in log and "No space left on device" in log
    assert "MiB free on that file system" in log and "previous intact checkpoint is" in log
    assert "step_000001. Free some space" in log
    assert "Traceback" not in log   # one line, not a stack
    ckpts = out / "checkpoints"
    assert marker(out) == "step_000001" and not list(ckpts.glob(".tmp_*")) and not (ckpts / "step_000002").exists()
    rows = run(env, out, steps=3, save_every=1, resume=True)
    assert_same_rows(rows, reference[:3])
    assert "resumed from step_000001 at step 1" in (out / "train.log").read_text()
