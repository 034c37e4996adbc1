"""How long `ragrl compare` takes: trained runs, their starts and the baselines on the same questions,
from an empty cache (nothing reused from an earlier comparison; identical systems inside this one are
still run once, as the command does).

    .venv/bin/python benchmarks/compare.py runs/leaderboard/train/* --data kit:eval/hotpotqa_dev.jsonl.gz \\
        --data kit:eval/musique_dev.jsonl.gz --n 200 --corpus kit:corpus/wiki_passages.jsonl.gz \\
        --out-dir runs/leaderboard/compare

Prints the table and writes results/compare.json: per system its wall seconds, seconds and generated
tokens per question, whether it was reused, and the total; the machine and its load before the run.
The comparison itself (compare.md, compare.json, the plot, the viewer's files) stays in --out-dir.

`--dtype bfloat16` times the same comparison with bfloat16 weights; `--against DIR` (an earlier
comparison of the same systems and questions, e.g. the float32 one) adds, per system, the share of
questions whose tokens are the very same and the F1 and search gain differences (this run minus DIR's),
so a faster precision's cost in figures is measured beside its speed.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from pathlib import Path

from ragrl.compare.comparison import run_comparison
from ragrl.eval.report import file_stem, load_trajectories
from ragrl.train.run_dir import describe_machine

RESULTS = Path(__file__).resolve().parent / "results"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", type=Path, help="training run folders")
    ap.add_argument("--data", action="append", required=True, help="question file (repeatable)")
    ap.add_argument("--n", type=int, default=None, help="the first N questions of each file")
    ap.add_argument("--corpus", default=None)
    ap.add_argument("--index", default=None)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--allow-mismatch", action="store_true")
    ap.add_argument("--skip-start", action="append", default=[], help="leave out this run's start (repeatable)")
    ap.add_argument("--keep-cache", action="store_true",
                    help="reuse the systems an earlier (killed) run of this benchmark measured: their measured times "
                         "count in the sum, the wall time of this call does not include them")
    ap.add_argument("--out-dir", type=Path, required=True, help="the comparison's folder (its cache is emptied first)")
    ap.add_argument("--dtype", default="float32", help="the LM weights' precision (ragrl compare --dtype)")
    ap.add_argument("--against", type=Path, default=None,
                    help="an earlier comparison's folder: per system, identical answers and figure differences")
    ap.add_argument("--out", type=Path, default=RESULTS / "compare.json")
    args = ap.parse_args()

    if not args.keep_cache:
        shutil.rmtree(args.out_dir / "systems", ignore_errors=True)   # a fresh cache: every distinct system runs
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    table = run_comparison(args.runs, data=args.data, n=args.n, out=args.out_dir, corpus=args.corpus, index=args.index,
                           batch_size=args.batch_size, allow_mismatch=args.allow_mismatch,
                           skip_start=frozenset(args.skip_start), dtype=args.dtype)
    total = time.perf_counter() - t0
    rows = table["rows"]
    n = next(iter(rows.values()))["n"]
    systems = {name: {"wall_s": round(r["seconds_per_q"] * r["n"], 1), "s_per_q": round(r["seconds_per_q"], 3),
                      "tokens_per_q": round(r["tokens"]["mean"], 1), "reused": r["reused"]} for name, r in rows.items()}
    result = {"what": "ragrl compare from an empty cache" + (" (continued: --keep-cache)" if args.keep_cache else ""),
              "questions": n, "data": args.data, "weights": args.dtype, "runs": [str(p) for p in args.runs], "systems": systems,
              "this_call_s": round(total, 1),
              # every system's own measured evaluation time, whichever call measured it: a comparison from scratch
              "sum_of_systems_s": round(sum(s["wall_s"] for s in systems.values() if not str(s["reused"]).startswith("identical")), 1),
              "evaluated_in_this_call": sum(1 for s in systems.values() if not s["reused"]),
              "machine": describe_machine(), "load_before": round(load, 2), "threads": os.environ.get("OMP_NUM_THREADS"),
              "date": time.strftime("%Y-%m-%dT%H:%M:%S")}
    if args.against is not None:
        result["against"] = {"folder": str(args.against), "systems": agreement(args.out_dir, args.against, rows)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    for name, s in systems.items():
        print(f"{name:<32} {s['wall_s']:>8.1f} s  {s['s_per_q']:.3f} s/q  {s['tokens_per_q']:>6.1f} tok/q  {s['reused'] or ''}")
    print(f"{result['sum_of_systems_s'] / 60:.1f} min of evaluation for {len(systems)} systems on {n} questions "
          f"(this call {total / 60:.1f} min)")


def agreement(here: Path, there: Path, rows: dict) -> dict:
    """Per system in both comparisons: questions whose generated tokens are identical, and this one's
    F1 and search gain minus the other's (percentage points)."""
    theirs = json.loads((there / "compare.json").read_text())["rows"]
    out = {}
    for name in rows:
        stem = file_stem(name)
        a, b = here / f"trajectories_{stem}.jsonl", there / f"trajectories_{stem}.jsonl"
        if name not in theirs or not b.is_file():
            continue
        mine = {t.sample_id: t.token_ids for t in load_trajectories(a)}
        other = {t.sample_id: t.token_ids for t in load_trajectories(b)}
        same = [mine[q] == other[q] for q in mine if q in other]
        out[name] = {"questions": len(same), "identical_tokens": round(sum(same) / len(same), 3),
                     "f1_diff": round(rows[name]["f1"]["mean"] - theirs[name]["f1"]["mean"], 2),
                     "search_gain_diff": round(rows[name]["search_gain"]["mean"] - theirs[name]["search_gain"]["mean"], 2)}
    return out


if __name__ == "__main__":
    main()
