"""Result tables of the evaluation scripts: paired-difference cells and rows in points, and a result
written as OUT.json beside its Markdown table OUT.md.

A paired difference is the tuple `ragrl.eval.stats.paired_bootstrap_diff` returns: (mean, CI low,
CI high, p), as fractions.
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path


def diff_cell(d) -> str:
    """One paired difference (mean, lo, hi, p), fractions, as a table cell in points.

    >>> diff_cell((0.012, -0.003, 0.026, 0.07))
    '+1.2 [-0.3, +2.6], p 0.070'
    """
    return f"{100 * d[0]:+.1f} [{100 * d[1]:+.1f}, {100 * d[2]:+.1f}], p {d[3]:.3f}"


def paired_row(name: str, diffs: dict, keys: Sequence[str]) -> str:
    """A Markdown table row: `name`, then one `diff_cell` per metric in `keys` (`diffs`: metric -> difference).

    >>> paired_row("R - SFT", {"f1": (0.1, 0.0, 0.2, 0.04), "em": (0.0, -0.1, 0.1, 1.0)}, ("f1", "em"))
    '| R - SFT | +10.0 [+0.0, +20.0], p 0.040 | +0.0 [-10.0, +10.0], p 1.000 |'
    """
    return f"| {name} | " + " | ".join(diff_cell(diffs[k]) for k in keys) + " |"


def write_results(out: str | Path, result: dict, md: list[str]) -> None:
    """OUT.json (`result`, indent 1) and OUT.md (the lines of `md`), and the table printed.
    OUT's own suffix, if any, is replaced."""
    Path(out).with_suffix(".json").write_text(json.dumps(result, indent=1))
    Path(out).with_suffix(".md").write_text("\n".join(md))
    print("\n".join(md))
