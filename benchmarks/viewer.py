"""`ragrl view` on a large trajectories file (issue #57): time, peak memory and page size.

    .venv/bin/python benchmarks/viewer.py              # ~1 min on 2 CPU cores -> benchmarks/results/viewer.json

Writes one `trajectories_agent.jsonl` of about `--mb` megabytes (default 100) of realistic
episodes (a search with three 30-word passages, then an answer; the texts vary per question) and
the same questions' `trajectories_naive_rag.jsonl` file, then times `write_view` over the folder.
The viewer streams each file a line at a time and, over `MAX_PER_SYSTEM` trajectories, embeds a
fixed sample of question ids (the same in both systems); the page's size is what a browser loads.
`ragrl view` runs in its own process (the CLI, as a user runs it): its wall time from start to exit
(imports included) and its peak resident set (its own ru_maxrss, from wait4). One table is printed and written as JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ragrl.eval.report import write_trajectories
from ragrl.eval.viewer import MAX_PER_SYSTEM
from ragrl.rollout.trajectory import Trajectory, Turn

ROOT = Path(__file__).resolve().parents[1]
WORDS = ("river city king battle album film season province company river born played founded "
         "university station population county league church war empire island army novel").split()


def episode(i: int, rng: random.Random) -> Trajectory:
    passages = [" ".join(rng.choice(WORDS) for _ in range(30)) for _ in range(3)]
    obs = "<information>" + "".join(f"Doc {k + 1}: {p}\n" for k, p in enumerate(passages)) + "</information>"
    turns = [Turn(action_text=f"<search> who founded the {rng.choice(WORDS)} of question {i} </search>", kind="search",
                  queries=[f"question {i}"], passage_ids=[[f"p{i}-{k}" for k in range(3)]], observation=obs),
             Turn(action_text=f"<answer> {rng.choice(WORDS)} </answer>", kind="answer")]
    return Trajectory(sample_id=f"q{i}", question=f"Question {i}: who founded the {rng.choice(WORDS)}?",
                      golds=[rng.choice(WORDS)], token_ids=[], action_mask=[], logprobs=[], prompt_len=0, turns=turns,
                      answer=turns[-1].action_text, num_searches=1, reward=0.0, metrics={"em": 0.0, "f1": 0.0})


def write_files(d: Path, mb: float) -> None:
    rng = random.Random(0)
    probe = d / "probe.jsonl"
    write_trajectories(probe, [episode(i, rng) for i in range(200)])
    n = int(mb * 2**20 / (probe.stat().st_size / 200))
    probe.unlink()
    for name in ("agent", "naive_rag"):
        write_trajectories(d / f"trajectories_{name}.jsonl", [episode(i, rng) for i in range(n)])
    (d / "n.json").write_text(json.dumps(n))


def run_view(d: Path):
    """(seconds, rusage) of `ragrl view d` in its own process: this child's rusage, from wait4."""
    t0 = time.perf_counter()
    view = subprocess.Popen([sys.executable, "-m", "ragrl.cli.main", "view", str(d)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(view.pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, f"ragrl view {d} failed"
    return time.perf_counter() - t0, usage


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=float, default=100.0, help="size of the agent's trajectories file (MB)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "viewer.json")
    ap.add_argument("--write", type=Path, help=argparse.SUPPRESS)   # the child that writes the files
    args = ap.parse_args()
    if args.write:
        write_files(args.write, args.mb)
        return
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        # Written by a child process: a forked `ragrl view` would inherit a writer's resident set in
        # its ru_maxrss, which execve does not reset.
        subprocess.run([sys.executable, __file__, "--write", str(d), "--mb", str(args.mb)], check=True)
        n = json.loads((d / "n.json").read_text())
        sizes = {p.name: p.stat().st_size for p in d.glob("trajectories_*.jsonl")}
        # `ragrl view` in its own process: its peak memory is the child's, not this writer's
        seconds, usage = run_view(d)
        small = d / "small"   # the same command on 10 trajectories: what the CLI's imports cost alone
        small.mkdir()
        with open(d / "trajectories_agent.jsonl") as f, open(small / "trajectories_agent.jsonl", "w") as g:
            g.writelines(line for _, line in zip(range(10), f))
        _, base = run_view(small)
        page = d / "view.html"
        result = {
            "machine": f"{platform.processor() or platform.machine()}, {platform.system()}",
            "trajectories_per_file": n, "file_mb": {k: round(v / 2**20, 1) for k, v in sizes.items()},
            "max_per_system": MAX_PER_SYSTEM, "view_s": round(seconds, 1),
            "page_mb": round(page.stat().st_size / 2**20, 1),
            "view_peak_rss_mb": round(usage.ru_maxrss / 1024),
            "view_peak_rss_mb_on_10_trajectories": round(base.ru_maxrss / 1024),
            "how": "streamed a line at a time; over max_per_system, a fixed sample of question ids (the same in every system)",
        }
    print(f"{n} trajectories per file ({', '.join(f'{k} {v} MB' for k, v in result['file_mb'].items())}): "
          f"view in {result['view_s']} s, page {result['page_mb']} MB ({MAX_PER_SYSTEM} per system), "
          f"peak RSS of `ragrl view` {result['view_peak_rss_mb']} MB "
          f"({result['view_peak_rss_mb_on_10_trajectories']} MB on 10 trajectories)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
