"""What the paired ablation scripts share (issue #58): one SFT start and the arms trained from it, one
`ragrl compare` of the arms and their start, and a table of per-episode axes, per question set and
pooled, with each system's mean and each named pair's paired difference (95% bootstrap CIs).

A script declares its arms (`ragrl.compare.train_runs.plan_arms`' {name: (recipe, overrides)}), its
axes (what one episode measures) and its pairs, and writes its own verdict: the rule in
experiments/README.md fixes each one before the runs.
"""
from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ragrl.cli.console import setup_console
from ragrl.compare.read import episodes, question_sets
from ragrl.compare.train_runs import plan_arms, train_runs
from ragrl.eval.cells import ci_cell, diff_cell, markdown_table
from ragrl.eval.stats import ci_record, paired_record
from ragrl.rollout.trajectory import Trajectory
from ragrl.train.run_dir import read_metrics

# The leaderboard's multi-hop questions (803): all of each file.
MULTIHOP_EVAL = ("kit:eval/hotpotqa_dev.jsonl.gz", "kit:eval/2wikimultihopqa_dev.jsonl.gz",
                 "kit:eval/musique_dev.jsonl.gz")


def ragrl(*args: object) -> None:
    """Run a ragrl command (the CLI beside this interpreter), failing loudly."""
    subprocess.run([str(Path(sys.executable).with_name("ragrl")), *map(str, args)], check=True)


def train_start_and_arms(root: Path, recipe: str, variant: str, sft_overrides: list[str],
                         arms: dict[str, tuple[str, list[str]]], *, minutes: float = 0) -> list[Path]:
    """`ragrl sft` of `recipe` into root/sft (skipped when its adapter is there), then every arm in order
    (each resolved before any trains; a finished one skipped, a killed one resumed). Returns the arms' folders."""
    plans = plan_arms(arms, root, variant=variant)
    sft = root / "sft"
    if not (sft / "adapter" / "adapter_config.json").is_file():
        ragrl("sft", recipe, "--variant", variant, *[x for o in sft_overrides for x in ("--set", o)], "--out", sft)
    return train_runs(plans, minutes=minutes)


def compare(folder: Path, runs: list[Path], data: tuple[str, ...], n: int | None = None) -> Path:
    """`ragrl compare` of the runs, with the first run's start only (the arms share it), into `folder`."""
    ragrl("compare", *runs, *[x for d in data for x in ("--data", d)], *(["--n", n] if n else []),
          *[x for r in runs[1:] for x in ("--skip-start", r.name)], "--out", folder)
    return folder


def keep_run_files(out: Path, folder: Path, runs: dict[str, Path]) -> list[Path]:
    """Copy what the results cite beside `out` (runs/ is not committed): the comparison's own table,
    `<out>_compare.{md,json}`, and each run's resolved config and metrics, `<out>_<name>_{config.yaml,
    metrics.jsonl}` for `runs` {name: run folder}. Returns the files written."""
    named = [(folder / f"compare{x}", f"compare{x}") for x in (".md", ".json")]
    named += [(run / f, f"{name}_{f}") for name, run in runs.items() for f in ("config.yaml", "metrics.jsonl")]
    written = []
    for src, name in named:
        dest = out.with_name(f"{out.name}_{name}")
        shutil.copyfile(src, dest)
        written.append(dest)
    return written


@dataclass(frozen=True)
class Axis:
    """What one episode measures: `value` (None where the episode has no such figure, e.g. a yes/no
    question's search gain), shown as `label`, times `scale` (100: fractions become points)."""

    label: str
    value: Callable[[Trajectory], float | None]
    scale: float = 100.0
    fmt: str = ".1f"
    signed: bool = False


F1 = Axis("F1", lambda t: t.metrics["f1"])
SEARCH_GAIN = Axis("search gain", lambda t: t.metrics.get("search_gain"), signed=True)
SEARCHES = Axis("searches/q", lambda t: float(t.num_searches), scale=1.0, fmt=".2f")
FORMAT_ERRORS = Axis("format errors %", lambda t: float(t.format_errors > 0))


def axis_record(eps: dict[str, Trajectory], ids: list[str], axis: Axis) -> dict | None:
    """The axis's mean over the questions that have it, with its CI (`ci_record`); None where none has."""
    values = [v for v in (axis.value(eps[i]) for i in ids) if v is not None]
    return ci_record(values, scale=axis.scale) if values else None


def axis_diff(a: dict[str, Trajectory], b: dict[str, Trajectory], ids: list[str], axis: Axis) -> dict | None:
    """b − a over the questions where both have the axis (`paired_record`); None where none has."""
    pairs = [(x, y) for x, y in ((axis.value(a[i]), axis.value(b[i])) for i in ids) if x is not None and y is not None]
    return paired_record([x for x, _ in pairs], [y for _, y in pairs], scale=axis.scale) if pairs else None


def ablation_table(folder: Path, systems: dict[str, str], axes: dict[str, Axis],
                   pairs: dict[str, tuple[str, str]]) -> dict:
    """Per question set and pooled: each system's axes ({label: name in the comparison}) and each pair's
    paired differences ({label: (a, b)}, b − a, by system label)."""
    eps = {label: episodes(folder, name) for label, name in systems.items()}
    sets = {}
    for set_name, ids in question_sets(folder).items():
        sets[set_name] = {
            "n": len(ids),
            "systems": {label: {k: axis_record(e, ids, ax) for k, ax in axes.items()} for label, e in eps.items()},
            "paired": {label: {k: axis_diff(eps[a], eps[b], ids, ax) for k, ax in axes.items()}
                       for label, (a, b) in pairs.items()}}
    return {"compare": str(folder), "sets": sets}


def claim_label(treated: str, control: str) -> str:
    return f"{treated} − {control}"


def pair_table(folder: Path, treated: str, control: str, axes: dict[str, Axis]) -> dict:
    """`ablation_table` of a pair of arms from one start (`treated` the comparison's first run, whose
    start it evaluates): direct, naive RAG, the start and both arms; each arm − the start, and
    treated − control (the claim's figure, under `claim_label`)."""
    systems = {"direct": "direct", "naive RAG": "naive_rag", "SFT start": f"{treated} (start)", treated: treated,
               control: control}
    pairs = {f"{treated} − SFT start": ("SFT start", treated), f"{control} − SFT start": ("SFT start", control),
             claim_label(treated, control): (control, treated)}
    return ablation_table(folder, systems, axes, pairs)


def ablation_args(doc: str, root: str, out: str) -> argparse.Namespace:
    """A pair script's command line (--root, --n, --out), and the console `ragrl` shows: its own lines and
    bars, not the libraries'."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--root", type=Path, default=Path(root), help="where the start and arms train")
    ap.add_argument("--n", type=int, help="the first N questions of each held-out file (default: all)")
    ap.add_argument("--out", type=Path, default=Path(out), help="where to write <out>.json and <out>.md (and a plot)")
    args = ap.parse_args()
    setup_console()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    return args


def either_axis_verdict(claim: dict[str, dict | None]) -> str:
    """A claim on two axes: reproduced in direction if one has its CI above 0 and none below; not
    reproduced if one is below and none above; no clear difference otherwise (an axis measured on no
    question counts as neither).

    >>> d = lambda lo, hi: {"diff": (lo + hi) / 2, "ci_lo": lo, "ci_hi": hi}
    >>> either_axis_verdict({"f1": d(0.5, 3.0), "search_gain": d(-1.0, 2.0)})
    'reproduced in direction'
    >>> either_axis_verdict({"f1": d(-3.0, -0.5), "search_gain": None})
    'not reproduced'
    >>> either_axis_verdict({"f1": d(0.5, 3.0), "x": d(-4.0, -1.0)}), either_axis_verdict({"f1": d(-1, 1)})
    ('no clear difference', 'no clear difference')
    """
    measured = [d for d in claim.values() if d is not None]
    above, below = any(d["ci_lo"] > 0 for d in measured), any(d["ci_hi"] < 0 for d in measured)
    if above and not below:
        return "reproduced in direction"
    if below and not above:
        return "not reproduced"
    return "no clear difference"


def pair_markdown(title: str, claim: str, result: dict, axes: dict[str, Axis], held_apart_questions: str) -> list[str]:
    """A pair's report: the title, the verdict on `claim`, the held-apart curve (if the result has one) and
    the tables."""
    md = [f"# {title} (issue #58)", "",
          f"Comparison folder: `{result['compare']}`. Verdict (the rule's, pooled {claim}): **{result['verdict']}**.", ""]
    if result.get("held_apart"):
        md += [f"Held-apart ({held_apart_questions}) at each step:", "", *held_apart_markdown(result["held_apart"]), ""]
    return md + table_markdown(result, axes)


def table_markdown(result: dict, axes: dict[str, Axis]) -> list[str]:
    """Each set's systems (mean [CI] per axis) and pairs (Δ [CI] per axis) as Markdown tables."""
    md = []
    for set_name, e in result["sets"].items():
        md += [f"## {set_name} ({e['n']} questions)", ""]
        md += markdown_table(["system", *(ax.label for ax in axes.values())],
                             [[label, *(ci_cell(s[k], ax.fmt, signed=ax.signed) for k, ax in axes.items())]
                              for label, s in e["systems"].items()]) + [""]
        md += markdown_table(["paired", *(f"Δ{ax.label}" for ax in axes.values())],
                             [[label, *(diff_cell(d[k], fmt=ax.fmt) for k, ax in axes.items())] for label, d in e["paired"].items()]) + [""]
    return md


def held_apart(run: Path, keys: tuple[str, ...] = ("f1", "search_gain", "searches", "format_error_rate")) -> dict[int, dict]:
    """A run's held-apart evaluations from its metrics.jsonl: {step (1-based): {key: eval/<key>}}."""
    return {r["step"] + 1: {k: r.get(f"eval/{k}") for k in keys}
            for r in read_metrics(run) if any(f"eval/{k}" in r for k in keys)}


def held_apart_markdown(curves: dict[str, dict[int, dict]]) -> list[str]:
    """{arm: held_apart(...)} as one table, a row per arm and step (None shown as n/a)."""
    keys = list(next((v for steps in curves.values() for v in steps.values()), {}))
    cell = lambda v: "n/a" if v is None else f"{v:.2f}"   # noqa: E731
    return markdown_table(["arm", "step", *keys], [[arm, str(step), *(cell(v[k]) for k in keys)]
                                                   for arm, steps in curves.items() for step, v in steps.items()])
