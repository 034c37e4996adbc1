"""A rank that dies or hangs: the other stops within a bound, naming it and the step; --resume then
continues exactly.

The launch tests start two torchrun agents of one rank each (`--nnodes 2`, on this host): what two
machines do. Each agent watches only its own rank, so the survivor's exit is ragrl's doing, not the
launcher's (one agent with two ranks kills the survivor itself when a rank dies, and names the
rank in its own summary). The unit tests watch two RankWatch threads over a real TCPStore.
"""
import contextlib
import datetime
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch.distributed as dist

from ragrl.errors import RankLost
from ragrl.train.rank_watch import RankWatch, is_collective_failure
from ragrl.train.run_dir import read_metrics
from tests.train.test_distributed import free_port
from tests.train.test_trainer_resume import assert_same_rows, write_jsonl

HERE = Path(__file__).resolve().parent
GLOO_CLOSED = ("[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
               "[127.0.0.1]:1975. This is typically caused by a remote worker crashing.")
GLOO_TIMEOUT = "[/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 3000ms for recv"


# ---------------------------------------------------------------- the watch alone

@pytest.fixture
def store():
    return dist.TCPStore("127.0.0.1", 0, 1, True, timeout=datetime.timedelta(seconds=5))


def wait_for(cond, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_a_silent_rank_is_named_with_its_last_step_within_the_bound(store):
    w0 = RankWatch(0, 2, silence_s=1.0, store=store, exit_on_lost=False)
    w1 = RankWatch(1, 2, silence_s=1.0, store=store, exit_on_lost=False)
    w1.at(3, "rollout")
    time.sleep(0.5)
    assert w0.verdict is None and w1.verdict is None   # both beating: nobody is lost
    w1._stop.set()                                     # rank 1 freezes: no last beat
    t0 = time.monotonic()
    wait_for(lambda: w0.verdict is not None)
    assert time.monotonic() - t0 < 3.0                 # the bound (1 s) plus a beat or two
    assert "rank 1 stopped responding" in w0.verdict and "its last beat: step 3, rollout" in w0.verdict
    assert "guard.rank_silence_s=1" in w0.verdict


def test_a_rank_that_failed_or_finished_says_so_in_its_last_beat(store):
    w0 = RankWatch(0, 3, silence_s=2.0, store=store, exit_on_lost=False)
    w1 = RankWatch(1, 3, silence_s=2.0, store=store, exit_on_lost=False)
    w2 = RankWatch(2, 3, silence_s=2.0, store=store, exit_on_lost=False)
    w2.at(4, "update")
    w2.stop()                                          # done: waits in the final barrier, not lost
    w1.at(4, "evaluation")
    w1.stop(error=ValueError("bad row 17"))
    wait_for(lambda: w0.verdict is not None)
    assert w0.verdict == "rank 1 stopped on an error at step 4 (evaluation): ValueError: bad row 17"
    w0.stop()


def test_a_failed_collective_is_explained_by_the_rank_behind(store):
    w0 = RankWatch(0, 2, silence_s=1.0, store=store, exit_on_lost=False)
    w1 = RankWatch(1, 2, silence_s=1.0, store=store, exit_on_lost=False)
    w1.at(2, "rollout")                                # alive, its main thread stuck in a rollout
    w0.at(2, "update")                                 # waiting in the gradient all-reduce
    time.sleep(0.3)
    err = w0.explain(RuntimeError(GLOO_TIMEOUT))
    assert isinstance(err, RankLost) and err.exit_code == 69
    assert str(err).startswith("rank 0 stopped at step 2 (update): rank 1 is alive but did not reach the "
                               "collective (it is at step 2, rollout)")
    assert "Timed out waiting 3000ms" in str(err) and "--resume" in str(err)
    w1.stop()
    w0.stop()


def test_collective_failures_are_told_from_a_rank_s_own_errors():
    assert is_collective_failure(RuntimeError(GLOO_CLOSED)) and is_collective_failure(RuntimeError(GLOO_TIMEOUT))
    assert not is_collective_failure(RuntimeError("mat1 and mat2 shapes cannot be multiplied (2x3 and 4x5)"))
    assert not is_collective_failure(ValueError("gloo"))


# ---------------------------------------------------------------- two torchrun agents

@pytest.fixture(scope="module")
def setup(tmp_path_factory, tiny_model_dir):
    from ragrl.datasets import load_questions

    root = tmp_path_factory.mktemp("rank_faults")
    write_jsonl(root / "train.jsonl", load_questions("demo-train")[:8])
    write_jsonl(root / "corpus.jsonl", [{"id": f"p{i}", "title": f"t{i}", "text": f"passage number {i}"}
                                        for i in range(50)])
    sets = {"model.name": tiny_model_dir, "questions_per_step": 2, "rollout.n": 2,
            "rollout.max_turns": 2, "rollout.max_turn_tokens": 8, "rollout.max_response_tokens": 48,
            "sft.steps": 0, "eval_every": 0, "save_every": 1, "data.train": root / "train.jsonl",
            "data.corpus": root / "corpus.jsonl", "lr": 0.01, "algo.entropy_coef": 0.01, "seed": 3,
            "guard.rank_silence_s": 5, "guard.collective_timeout_s": 10}
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "RAGRL_HOME": str(root / "home")}
    return {"root": root, "sets": sets, "env": env}


def launch(setup, out: Path, steps: int, *extra: str, fault_env: dict | None = None, timeout=300, wait_for=(0, 1)):
    """Two torchrun agents (node ranks 0 and 1, one process each); -> ([rc0, rc1], [log0, log1], seconds
    from the first agent's exit to the last's). Only the agents in `wait_for` must exit by themselves;
    the others are killed (their process group) once those have."""
    port = free_port()
    sets = {**setup["sets"], "out_dir": out, "steps": steps}
    args = [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]
    procs = []
    for node in (0, 1):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node_rank", str(node),
               "--nproc_per_node", "1", "--master_addr", "127.0.0.1", "--master_port", str(port),
               str(HERE / "train_worker.py"), "train", "search_r1_grpo", "--variant", "tiny", *args, *extra]
        log = open(setup["root"] / f"{out.name}{'.resume' * ('--resume' in extra)}.node{node}.log", "w")
        procs.append((subprocess.Popen(cmd, env={**setup["env"], **(fault_env or {})}, stdout=log,
                                       stderr=subprocess.STDOUT, start_new_session=True), log))
    ended = {}
    deadline = time.monotonic() + timeout
    while not set(wait_for) <= set(ended) and time.monotonic() < deadline:
        for i, (p, _) in enumerate(procs):
            if i not in ended and p.poll() is not None:
                ended[i] = time.monotonic()
        time.sleep(0.1)
    for p, log in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)   # the agent and its rank (a stopped rank too)
        p.wait()
        log.close()
    logs = [Path(log.name).read_text() for _, log in procs]
    assert set(wait_for) <= set(ended), "an agent did not exit within the test's bound:\n" + every_rank_says(out, logs)
    return [p.returncode for p, _ in procs], logs, max(ended.values()) - min(ended.values())


def every_rank_says(out: Path, logs: list[str]) -> str:
    """Each agent's output and each rank's train log, last lines: why any of them stopped."""
    parts = [f"--- node {n} output:\n" + "\n".join(text.splitlines()[-25:]) for n, text in enumerate(logs)]
    for path in sorted(out.glob("train*.log")):
        parts.append(f"--- {path.name}:\n" + "\n".join(path.read_text().splitlines()[-15:]))
    return "\n".join(parts)


@pytest.fixture(scope="module")
def uninterrupted(setup):
    out = setup["root"] / "clean"
    rcs, logs, _ = launch(setup, out, 3)
    assert rcs == [0, 0], every_rank_says(out, logs)
    rows = read_metrics(out)
    assert [r["step"] for r in rows] == [0, 1, 2]
    return rows


def test_a_killed_rank_stops_the_other_naming_it_and_resume_continues_exactly(setup, uninterrupted):
    out = setup["root"] / "killed"
    rcs, logs, spread = launch(setup, out, 3, fault_env={
        "RAGRL_TEST_RANK_FAULT": "kill", "RAGRL_TEST_FAULT_RANK": "1", "RAGRL_TEST_FAULT_STEP": "1"})
    said = every_rank_says(out, logs)
    assert rcs[0] != 0 and rcs[1] != 0, said
    assert "exitcode: -9" in logs[1], said                              # rank 1 died by SIGKILL
    rank0 = logs[0] + (out / "train.log").read_text()
    assert "error: rank 0 stop" in logs[0] and "exitcode: 69" in logs[0], said
    assert "at step 1" in rank0 and "rank 1 " in rank0, said
    assert spread < 30, f"rank 0 outlived rank 1 by {spread:.0f} s:\n{said}"   # not the 10 s collective timeout's multiple
    assert json.loads((out / "checkpoints" / "step_000001" / "trainer_state.json").read_text())["step"] == 1
    rcs, logs, _ = launch(setup, out, 3, "--resume")
    assert rcs == [0, 0], every_rank_says(out, logs)
    assert_same_rows(read_metrics(out), uninterrupted)
    assert "resumed from step_000001 at step 1" in (out / "train.log").read_text()


def test_a_hung_rank_stops_the_other_at_the_collective_timeout_naming_it(setup):
    out = setup["root"] / "hung"
    t0 = time.monotonic()
    rcs, logs, _ = launch(setup, out, 3, fault_env={
        "RAGRL_TEST_RANK_FAULT": "hang", "RAGRL_TEST_FAULT_RANK": "1", "RAGRL_TEST_FAULT_STEP": "1"})
    took = time.monotonic() - t0
    said = every_rank_says(out, logs)
    assert rcs[0] != 0 and rcs[1] != 0, said
    assert "exitcode: 69" in logs[0] and "exitcode: 69" in logs[1], said   # both ranks stop themselves
    assert ("error: rank 0 stopped at step 1 (update): rank 1 is alive but did not reach the collective "
            "(it is at step 1, rollout)") in logs[0], said
    assert "Timed out" in logs[0], said
    # rank 1's own thread sees the store's holder (agent 0) go, and leaves its hung main thread
    assert "the process group's store stopped answering" in logs[1], said
    assert took < 240, said   # far under the 600 s hang


def test_a_frozen_rank_is_named_by_the_other_within_its_silence_bound(setup):
    """Rank 1 SIGSTOPs itself in step 1's rollout: no thread of it runs, so its heartbeat stops. Rank 0,
    blocked in the step's collective (whose 10 s timeout would also end it), leaves from its watch thread
    after guard.rank_silence_s (5 s), naming rank 1 and its last step. Agent 1, still waiting on its
    stopped rank, is the launcher's (or the user's) to end; the test kills it."""
    out, pidfile = setup["root"] / "frozen", setup["root"] / "frozen.pid"
    try:
        rcs, logs, _ = launch(setup, out, 3, "--set", "guard.collective_timeout_s=120", wait_for=(0,), fault_env={
            "RAGRL_TEST_RANK_FAULT": "stop", "RAGRL_TEST_FAULT_RANK": "1", "RAGRL_TEST_FAULT_STEP": "1",
            "RAGRL_TEST_FAULT_PIDFILE": str(pidfile)})
    finally:   # the stopped rank outlives its killed agent (torchrun gives it a session of its own)
        if pidfile.exists():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pidfile.read_text()), signal.SIGKILL)
    said = every_rank_says(out, logs)
    assert rcs[0] != 0 and "exitcode: 69" in logs[0], said
    assert "rank 1 stopped responding: no heartbeat for" in logs[0], said
    assert "guard.rank_silence_s=5; its last beat: step 1, rollout" in logs[0], said
    assert "rank 1 stopped responding" in (out / "train.log").read_text()   # in rank 0's log file too
