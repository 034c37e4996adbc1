"""The one place a figure becomes a table cell, and rows a Markdown table (every report, the
comparison, the quickstart, the leaderboard writer and the experiments use these).

A CI is `{"mean", "ci_lo", "ci_hi"}`; a paired difference is the record `ragrl.eval.stats.paired_record`
gives, `{"diff", "ci_lo", "ci_hi", "p_value", "n"}`; both already in the table's unit (percent or points).
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path


def format_p(p: float | None) -> str:
    """A p-value for a table: the bootstrap's floor (1 / (n_boot + 1)) reads as "<0.001".

    >>> format_p(0.0004997), format_p(0.0213), format_p(None)
    ('<0.001', '0.021', 'n/a')
    """
    return "n/a" if p is None else "<0.001" if p < 0.001 else f"{p:.3f}"


def ci_cell(m: dict | Sequence[float] | None, fmt: str = ".1f", *, signed: bool = False) -> str:
    """A mean with its 95% CI (a `ci_record`, or the (mean, lo, hi) triple older experiment results
    keep); "n/a" for none (`signed`: a + on positive numbers, for gains).

    >>> ci_cell({"mean": 41.23, "ci_lo": 36.0, "ci_hi": 46.5}), ci_cell(None)
    ('41.2 [36.0, 46.5]', 'n/a')
    >>> ci_cell({"mean": 1.234, "ci_lo": 0.5, "ci_hi": 2.0}, ".2f"), ci_cell([2.0, -1.0, 5.0], signed=True)
    ('1.23 [0.50, 2.00]', '+2.0 [-1.0, +5.0]')
    """
    if m is None:
        return "n/a"
    if not isinstance(m, dict):
        m = dict(zip(("mean", "ci_lo", "ci_hi"), m))
    f = ("+" if signed else "") + fmt
    return f"{m['mean']:{f}} [{m['ci_lo']:{f}}, {m['ci_hi']:{f}}]"


def diff_cell(d: dict | None, *, fmt: str = ".1f", with_p: bool = False) -> str:
    """A paired difference (`paired_record`): the mean with its CI (`fmt`, signed), and its p-value
    with `with_p`; a record without a CI shows its mean alone; "n/a" for none.

    >>> d = {"diff": -4.56, "ci_lo": -10.0, "ci_hi": 1.23, "p_value": 0.5, "n": 80}
    >>> diff_cell(d), diff_cell(d, with_p=True), diff_cell({"diff": 2.0}), diff_cell(None)
    ('-4.6 [-10.0, +1.2]', '-4.6 [-10.0, +1.2], p 0.500', '+2.0', 'n/a')
    >>> diff_cell({"diff": -0.125, "ci_lo": -0.2, "ci_hi": -0.05}, fmt=".2f")
    '-0.12 [-0.20, -0.05]'
    """
    if d is None:
        return "n/a"
    text = f"{d['diff']:+{fmt}}"
    if "ci_lo" in d:
        text += f" [{d['ci_lo']:+{fmt}}, {d['ci_hi']:+{fmt}}]"
    return text + (f", p {format_p(d.get('p_value'))}" if with_p else "")


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """Lines of a Markdown table.

    >>> markdown_table(["a", "b"], [["1", "2"]])
    ['| a | b |', '|---|---|', '| 1 | 2 |']
    """
    return ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|",
            *("| " + " | ".join(r) + " |" for r in rows)]


def paired_row(name: str, diffs: dict, keys: Sequence[str]) -> str:
    """A Markdown table row: `name`, then one `diff_cell` (with p) per metric in `keys`.

    >>> paired_row("R - SFT", {"f1": {"diff": 10.0, "ci_lo": 0.0, "ci_hi": 20.0, "p_value": 0.04}}, ("f1",))
    '| R - SFT | +10.0 [+0.0, +20.0], p 0.040 |'
    """
    return f"| {name} | " + " | ".join(diff_cell(diffs[k], with_p=True) for k in keys) + " |"


def write_results(out: str | Path, result: dict, md: list[str]) -> None:
    """OUT.json (`result`, indent 1) and OUT.md (the lines of `md`), and the table printed.
    OUT's own suffix, if any, is replaced."""
    Path(out).with_suffix(".json").write_text(json.dumps(result, indent=1))
    Path(out).with_suffix(".md").write_text("\n".join(md))
    print("\n".join(md))
