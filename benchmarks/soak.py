"""Faults at random over one long real run (issue #57): what ragrl did with each, the steps redone and
lost, and the run's final metrics, kept artifacts and weights against an uninterrupted run.

    .venv/bin/python benchmarks/soak.py                   # quick: 12 steps, 8 faults, ~2 min -> results/soak_quick.json
    .venv/bin/python benchmarks/soak.py --setting long    # ~1 hour: 600 steps, 40 faults -> results/soak_long.json

The run: MMOA-RAG's pipeline (`mmoa_mappo`'s tiny variant, which searches at every step whatever
the model writes) on a tiny random Llama with SmolLM2's tokenizer; 16 demo training questions, 2
per step x 2 pipelines; 2 held-out demo questions evaluated every 4 steps, the best policy kept by
F1; BM25 over 100 demo passages, served by a real `ragrl serve` process over HTTP
(guard.retrieval_wait_s 8); a checkpoint every 2 steps, 3 kept; trajectories every 3 steps. The
trainer is a process of its own (benchmarks/soak_worker.py: the real `ragrl train`).

The uninterrupted reference runs first. Then the same run again, meeting one fault at each of a
seeded sample of steps (a seeded part of a step after that step's row), its kind drawn in turn from
a seeded shuffle:

  trainer_killed      SIGKILL the trainer at a random moment, in a checkpoint write, in an evaluation,
                      or right after a metrics row (each in turn, from a seeded shuffle); then
                      `ragrl train --resume`
  checkpoint_damaged  SIGKILL it, truncate one file of the newest checkpoint or flip a byte of it; --resume
  disk_full           its next checkpoint write fails with ENOSPC partway through one of its files
                      (injected at the file layer, soak_worker.py); then --resume, as after freeing space
  server_restart      SIGKILL the retrieval server; start it again on its port 0.5-3 s later
  server_stall        SIGSTOP the retrieval server for 1-5 s, then SIGCONT
  server_outage       SIGKILL the server and keep it down until the trainer stops (exit 75); start it; --resume
  nan_loss            the update of seeded steps sees NaN log-probs. These steps are a property of the
                      run: the reference has them too (a skipped non-finite update is ragrl's answer to
                      them, so a reference without them could not have the same weights).

At the end: the soak run's metrics rows against the reference's (wall-clock readings aside), its
kept artifacts (every file but logs, TensorBoard events and training.json's wall times: the same
files, each file's bytes equal, or for JSON its values without wall-clock fields) and its final
weights. Per fault: what ragrl did, the steps redone (completed steps recomputed after a resume)
and lost (completed steps missing from, or differing in, the final metrics). One table is printed
and written as JSON.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from soak_outcome import checkpoints, compare_artifacts, compare_weights, same_rows  # noqa: E402  (beside this file)

ROOT = Path(__file__).resolve().parents[1]
WORKER = Path(__file__).resolve().with_name("soak_worker.py")
SETTINGS = {"quick": {"steps": 12, "faults": 8}, "long": {"steps": 600, "faults": 40}}
KINDS = ("trainer_killed", "checkpoint_damaged", "disk_full", "server_restart", "server_stall", "server_outage",
         "nan_loss")
KILL_MOMENTS = ("any moment", "checkpoint write", "evaluation", "row written")
RUN_SETS = ["model.dtype=float32", "questions_per_step=2", "rollout.n=2", "rollout.max_turn_tokens=8",
            "rollout.max_response_tokens=24", "sft.steps=0", "algo.minibatch_size=4", "data.eval_n=2", "eval_every=4",
            "keep_best=f1", "save_every=2", "keep_last=3", "log_trajectories_every=3", "guard.retrieval_wait_s=8",
            "report_to=[]"]
RAGRL = [sys.executable, "-c", "import sys; from ragrl.cli.main import main; sys.argv[0] = 'ragrl'; main()"]


def make_kit(root: Path) -> Path:
    """The tiny model, questions and corpus under root; the BM25 index's path (cached in $RAGRL_HOME)."""
    from ragrl.datasets import load_questions
    from ragrl.models.tiny import make_tiny_model
    from ragrl.paths import DEMO_CORPUS
    from ragrl.retrieval.corpus import load_corpus
    from ragrl.retrieval.resolve import cached_bm25_index

    make_tiny_model(root / "model")
    write = lambda name, rows: (root / name).write_text("".join(json.dumps(r) + "\n" for r in rows))  # noqa: E731
    write("train.jsonl", load_questions("demo-train")[:16])
    write("eval.jsonl", load_questions("demo-eval")[:2])
    corpus = load_corpus(DEMO_CORPUS)
    write("corpus.jsonl", [corpus.passage(i) for i in range(100)])
    return cached_bm25_index(str(root / "corpus.jsonl"))


class Server:
    """`ragrl serve` as a process of its own, always on one port."""

    def __init__(self, index: Path, log: Path):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.index, self.log, self.proc = index, log, None
        self.url = f"http://127.0.0.1:{self.port}"

    def start(self, wait: bool = True) -> None:
        with open(self.log, "a") as log:
            self.proc = subprocess.Popen([*RAGRL, "serve", "--index", str(self.index), "--port", str(self.port)],
                                         stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 120
        while wait and time.monotonic() < deadline:
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.2)
        if wait:
            raise RuntimeError(f"the retrieval server did not come up; see {self.log}")

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()


class Run:
    """One training run's launches: the first, then one `--resume` after each stop."""

    def __init__(self, root: Path, name: str, server: Server, steps: int, nan_steps: list[int]):
        self.dir, self.control = root / name, root / f"{name}_control"
        self.control.mkdir(parents=True)
        self.args = ["train", "mmoa_mappo", "--variant", "tiny"]
        for s in [f"model.name={root / 'model'}", f"data.train={root / 'train.jsonl'}",
                  f"data.eval={root / 'eval.jsonl'}", f"data.corpus={root / 'corpus.jsonl'}",
                  f"data.index={server.url}", *RUN_SETS, f"steps={steps}", f"out_dir={self.dir}"]:
            self.args += ["--set", s]
        self.env = {**os.environ, "RAGRL_SOAK_CONTROL": str(self.control),
                    "RAGRL_SOAK_NAN_STEPS": ",".join(map(str, nan_steps))}
        self.launches: list[Path] = []
        self.proc = None
        self.kill_moments = itertools.cycle(KILL_MOMENTS)   # soak() sets its seeded order

    def launch(self) -> None:
        (self.control / "phase").unlink(missing_ok=True)   # the last launch's phase is not this one's
        log = self.control / f"launch_{len(self.launches):03d}.log"
        self.launches.append(log)
        with open(log, "w") as out:
            self.proc = subprocess.Popen([sys.executable, str(WORKER), *self.args,
                                          *(["--resume"] if len(self.launches) > 1 else [])],
                                         stdout=out, stderr=subprocess.STDOUT, env=self.env)

    def wait(self, timeout: float) -> int | None:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def phase(self) -> str:
        try:
            return (self.control / "phase").read_text()
        except OSError:
            return ""

    def rows(self) -> list[dict]:
        from ragrl.train.run_dir import read_metrics
        return read_metrics(self.dir) if (self.dir / "metrics.jsonl").exists() else []

    def log_text(self, k: int = -1) -> str:
        return self.launches[k].read_text(errors="replace")


# ---------------------------------------------------------------- the faults

def kill_trainer(run: Run, moment: str) -> str:
    """SIGKILL now, or at `moment`: the worker holds there (DIR/hold) until killed; bounded, else now."""
    if moment != "any moment":
        (run.control / "hold").write_text(moment)
        deadline = time.monotonic() + 300
        while not run.phase().endswith(moment) and time.monotonic() < deadline and run.proc.poll() is None:
            time.sleep(0.01)
        (run.control / "hold").unlink(missing_ok=True)
    where = run.phase() or "startup"
    if run.proc.poll() is not None:
        return f"{where} (the trainer had stopped by itself, exit {run.proc.returncode})"
    run.kill()
    return f"step {where}" if where != "startup" else where


def trainer_killed(run, server, rng):
    moment = next(run.kill_moments)
    where = kill_trainer(run, moment)
    run.launch()
    return {"detail": f"aimed at: {moment}; killed at: {where}", "relaunched": True, "rows_before": len(run.rows())}


def checkpoint_damaged(run, server, rng):
    while len(checkpoints(run.dir)) < 2 and run.proc.poll() is None:   # one to damage, one to fall back to
        time.sleep(0.1)
    where = kill_trainer(run, "any moment")
    rows_before = len(run.rows())
    newest = checkpoints(run.dir)[-1]
    target = rng.choice(sorted(p for p in newest.iterdir() if p.is_file() and p.name != "manifest.json"))
    data = bytearray(target.read_bytes())
    how = rng.choice(("truncated", "byte flipped"))
    if how == "truncated":
        target.write_bytes(bytes(data[: rng.randrange(len(data))]))
    else:
        data[rng.randrange(len(data))] ^= 0xFF
        target.write_bytes(bytes(data))
    run.launch()
    return {"detail": f"killed at {where}; {newest.name}/{target.name} {how}", "relaunched": True,
            "rows_before": rows_before}


def disk_full(run, server, rng):
    (run.control / "disk_full").write_text(f"{rng.randrange(100)} {rng.random():.3f}")
    rc = run.wait(300)
    if rc is None:
        return {"detail": "no checkpoint write failed within 300 s", "relaunched": False, "rc": None}
    hit = (run.control / "disk_full_hit").read_text() if (run.control / "disk_full_hit").exists() else "?"
    message = next((ln for ln in run.log_text().splitlines() if "could not write checkpoint" in ln), "")
    leftovers = [p.name for p in (run.dir / "checkpoints").glob(".tmp_*")]
    rows_before = len(run.rows())
    run.launch()
    return {"detail": f"ENOSPC in {hit}", "rc": rc, "message": message.strip()[:300], "leftovers": leftovers,
            "relaunched": True, "rows_before": rows_before}


def server_restart(run, server, rng):
    down = rng.uniform(0.5, 3.0)
    server.kill()
    time.sleep(down)
    server.start()
    return {"detail": f"down {down:.1f} s", "relaunched": False}


def server_stall(run, server, rng):
    stalled = rng.uniform(1.0, 5.0)
    server.proc.send_signal(signal.SIGSTOP)
    time.sleep(stalled)
    server.proc.send_signal(signal.SIGCONT)
    return {"detail": f"stalled {stalled:.1f} s", "relaunched": False}


def server_outage(run, server, rng):
    server.kill()
    rc = run.wait(300)
    message = next((ln for ln in run.log_text().splitlines() if "run stopped with a checkpoint" in ln), "")
    server.start()
    if rc is None:
        return {"detail": "the trainer did not stop within 300 s", "rc": None, "relaunched": False}
    rows_before = len(run.rows())
    run.launch()
    return {"detail": "down until the trainer stopped", "rc": rc, "message": message.strip()[:300],
            "relaunched": True, "rows_before": rows_before}


INJECT = {"trainer_killed": trainer_killed, "checkpoint_damaged": checkpoint_damaged, "disk_full": disk_full,
          "server_restart": server_restart, "server_stall": server_stall, "server_outage": server_outage}


def plan_faults(n: int, steps: int, rng: random.Random) -> tuple[list[str], list[int]]:
    """n kinds in turn from seeded shuffles of every kind (so each comes up once per len(KINDS) faults);
    the nan_loss ones become seeded steps (never two in a row: guard.nonfinite_steps is 3)."""
    kinds = []
    while len(kinds) < n:
        kinds += rng.sample(KINDS, len(KINDS))
    kinds = kinds[:n]
    candidates = list(range(1, steps, 2))
    nan_steps = sorted(rng.sample(candidates, min(kinds.count("nan_loss"), len(candidates))))
    return [k for k in kinds if k != "nan_loss"], nan_steps


# ---------------------------------------------------------------- the soak

def resumed_at(run: Run, launch: int) -> int | None:
    """The step launch `launch` resumed at; None when the next fault killed it before it got that far
    (the launch after it then resumes, and that fault's record counts the steps redone)."""
    m = re.search(r"resumed from step_\d+ at step (\d+)", run.log_text(launch))
    return int(m.group(1)) if m else None


def damage_found(run: Run, launch: int) -> str:
    """The resume's warning that a checkpoint is damaged, shortened: "step_X is damaged (...); resuming from step_Y"."""
    for k in range(launch, len(run.launches)):
        m = re.search(r"checkpoint \S*/(step_\d+ is damaged .*)", run.log_text(k))
        if m:
            return m.group(1).replace(" instead", "")[:200]
    return ""


def retried(text: str) -> int:
    return len(re.findall(r"is not answering", text))


def wait_for_step(run: Run, step: int, then_s: float) -> bool:
    """Wait until the run has logged `step` rows, then `then_s` seconds more; False if it ended first."""
    while len(run.rows()) < step:
        if run.wait(0.2) is not None:
            return False
    return run.wait(then_s) is None


def soak(run: Run, server: Server, kinds: list[str], steps: int, step_s: float, rng: random.Random,
         bar) -> list[dict]:
    """The run with one fault after each seeded wait; every fault's record."""
    records = []
    run.kill_moments = itertools.cycle(rng.sample(KILL_MOMENTS, len(KILL_MOMENTS)))   # each in turn
    # The moments are counted in steps, not seconds, so a slower or busier machine meets the same
    # schedule: fault i comes at a seeded step spread over the run, a seeded part of a step later.
    at_steps = sorted(rng.sample(range(1, steps - 1), len(kinds)))
    run.launch()
    for kind, at in zip(kinds, at_steps):
        if not wait_for_step(run, at, rng.uniform(0.0, step_s)):
            break   # finished (or stopped): no fault left to place
        launch_log = run.launches[-1]
        mark = launch_log.stat().st_size
        t0 = time.monotonic()
        rec = {"fault": kind, "rows_before": len(run.rows())}
        rec.update(INJECT[kind](run, server, rng))   # rows_before: at the kill or stop, where there is one
        rec["at_step"] = rec["rows_before"]
        rec["seconds"] = round(time.monotonic() - t0, 1)
        rec["launch"] = len(run.launches) - 1 if rec.get("relaunched") else None
        if kind in ("server_restart", "server_stall"):
            time.sleep(1.0)   # the client's retries of this fault, if a request met it, are in the log by now
            rec["retries"] = retried(launch_log.read_text(errors="replace")[mark:])
            rec["trainer_alive"] = run.proc.poll() is None or run.proc.returncode == 0
        records.append(rec)
        bar.update(1)
    rc = run.wait(3600 * 4)
    if rc != 0:   # a stop no fault of ours explains is a finding: report it, don't hide it
        records.append({"fault": "unexpected_stop", "rc": rc, "detail": run.log_text()[-500:], "relaunched": False})
    return records


def judge(rec: dict, run: Run, rows: list[dict], differ: list[int]) -> dict:
    """What ragrl did, steps redone and lost, survived."""
    kind = rec["fault"]
    lost = sum(1 for s in differ if s < rec.get("rows_before", 0))
    if rec.get("relaunched"):
        at = resumed_at(run, rec["launch"])
        rec["steps_redone"] = None if at is None else max(0, rec["rows_before"] - at)
        resumed = f"--resume continued at step {at}" if at is not None else "--resume (the next fault came before it resumed)"
    if kind == "trainer_killed":
        rec["did"], ok = resumed, True
    elif kind == "checkpoint_damaged":
        found = damage_found(run, rec["launch"])
        rec["did"], ok = f"{found or 'damage NOT detected'}; {resumed}", bool(found)
    elif kind == "disk_full":
        ok = rec.get("rc") == 74 and not rec.get("leftovers") and "free" in rec.get("message", "")
        message = rec.get("message", "").replace(f"{run.dir}/", "").removeprefix("error: ")
        rec["did"] = f"exit {rec.get('rc')}: {message[:170]}; {resumed}"
    elif kind == "server_outage":
        ok = rec.get("rc") == 75
        rec["did"] = f"exit {rec.get('rc')} with a checkpoint; {resumed}"
    elif kind in ("server_restart", "server_stall"):
        ok = rec["trainer_alive"]
        rec["did"] = (f"the client retried {rec['retries']} time(s) and went on" if rec["retries"]
                      else "went on (no request met it, or it was answered late)")
        rec["steps_redone"] = 0
    elif kind == "nan_loss":
        row = rows[rec["at_step"]] if rec["at_step"] < len(rows) else {}
        ok = row.get("guard/nonfinite_skipped", 0) > 0 and row.get("updates", 1) == 0
        rec["did"] = f"skipped the update of step {rec['at_step']} ({row.get('guard/nonfinite_skipped', 0):g} non-finite)"
        rec["steps_redone"] = 0
    else:
        ok = False
        rec["did"] = f"exit {rec.get('rc')}"
    rec["steps_lost"], rec["survived"] = lost, ok and lost == 0
    return rec


def main() -> None:
    from tqdm import tqdm

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--setting", choices=sorted(SETTINGS), default="quick")
    ap.add_argument("--steps", type=int, help="training steps (default: the setting's)")
    ap.add_argument("--faults", type=int, help="faults to place (default: the setting's)")
    ap.add_argument("--seed", type=int, default=0, help="seeds the faults' kinds, moments and NaN steps")
    ap.add_argument("--keep", type=Path, help="keep the runs, logs and server log in this folder")
    ap.add_argument("--out", type=Path, help="JSON out (default: benchmarks/results/soak_SETTING.json)")
    args = ap.parse_args()
    steps = args.steps or SETTINGS[args.setting]["steps"]
    n_faults = args.faults or SETTINGS[args.setting]["faults"]
    if steps < 4 or not 1 <= n_faults <= steps - 2:
        ap.error("--steps must be at least 4, and --faults from 1 to steps - 2 (one fault a step at most)")
    out = args.out or ROOT / "benchmarks" / "results" / f"soak_{args.setting}.json"
    # A SIGTERM (a CI timeout, `kill`) ends the soak through its cleanup: no trainer or server left behind.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    rng = random.Random(args.seed)
    kinds, nan_steps = plan_faults(n_faults, steps, rng)
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="ragrl_soak_") as tmp:
        root = args.keep or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        server = Server(make_kit(root), root / "server.log")
        server.start()
        reference = Run(root, "reference", server, steps, nan_steps)
        run = Run(root, "soak", server, steps, nan_steps)
        try:
            t0 = time.perf_counter()
            reference.launch()
            if reference.wait(3600 * 4) != 0:
                raise SystemExit(f"the reference run failed: {reference.launches[-1]}")
            reference_s = time.perf_counter() - t0
            with tqdm(total=len(kinds), desc="faults", unit="fault") as bar:
                records = soak(run, server, kinds, steps, reference_s / steps, rng, bar)
        finally:
            for r in (reference, run):   # an error of the soak's own must not leave a trainer behind
                if r.proc is not None and r.proc.poll() is None:
                    r.kill()
            server.proc.send_signal(signal.SIGCONT)
            server.kill()
        rows, ref_rows = run.rows(), reference.rows()
        equal_rows, differ = same_rows(rows, ref_rows)
        records += [{"fault": "nan_loss", "at_step": s, "detail": "NaN log-probs in the update", "rows_before": 0}
                    for s in nan_steps]
        records = [judge(r, run, rows, differ) for r in records]
        files, weights = compare_artifacts(run.dir, reference.dir), compare_weights(run.dir, reference.dir)
        written = (run.control / "rows_written").read_text().split()
    kinds_seen = sorted({r["fault"] for r in records})
    summary = {"faults": len(records), "kinds": len(kinds_seen), "survived": sum(r["survived"] for r in records),
               "steps_lost": sum(r["steps_lost"] for r in records),
               # Rows written by every launch beyond the final ones: the work the faults made the run do again.
               "steps_redone": len(written) - len(rows), "rows_written": len(written), "launches": len(run.launches),
               "metrics_equal": equal_rows, "rows": len(rows), "reference_rows": len(ref_rows),
               "steps_differing": differ, "artifacts": files, "weights": weights,
               "reference_s": round(reference_s, 1), "total_s": round(time.perf_counter() - t_start, 1)}
    summary["passed"] = (summary["survived"] == len(records) and summary["steps_lost"] == 0 and equal_rows
                         and files["equal"] and weights["equal"])
    print_table(records, summary)
    out.parent.mkdir(parents=True, exist_ok=True)
    keep = ("fault", "at_step", "detail", "did", "survived", "steps_redone", "steps_lost", "seconds")
    out.write_text(json.dumps({"benchmark": "soak", "setting": args.setting, "steps": steps, "seed": args.seed,
                               "machine": platform.processor() or platform.machine(), "date": time.strftime("%Y-%m-%d"),
                               "run": RUN_SETS, "nan_steps": nan_steps, "summary": summary,
                               "faults": [{k: r.get(k) for k in keep} for r in records]}, indent=1) + "\n")
    print(f"wrote {out}")
    if not summary["passed"]:
        raise SystemExit(1)


def print_table(records: list[dict], summary: dict) -> None:
    from ragrl.eval.cells import markdown_table

    print("\n".join(markdown_table(
        ["#", "fault", "at step", "detail", "what ragrl did", "redone", "lost", "survived"],
        [[str(x) for x in (i + 1, r["fault"], r.get("at_step"), r.get("detail", "")[:90], r.get("did", "")[:220],
                           r.get("steps_redone"), r["steps_lost"], r["survived"])] for i, r in enumerate(records)])))
    s = summary
    print(f"{s['faults']} faults of {s['kinds']} kinds, {s['survived']} survived; {s['steps_lost']} completed steps "
          f"lost, {s['steps_redone']} redone, {s['launches']} launches; metrics rows equal: {s['metrics_equal']} "
          f"({s['rows']} of {s['reference_rows']}); artifacts equal: {s['artifacts']['equal']} ({s['artifacts']['files']} "
          f"files); weights equal: {s['weights']['equal']} (max |diff| {s['weights']['max_abs_diff']:g})")


if __name__ == "__main__":
    main()
