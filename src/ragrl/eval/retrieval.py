"""Retrieval metrics for a retriever (base or trained encoder): gold-passage recall@k and answer@k.

    out = retrieval_eval(search, samples, k=3)          # search(queries, k) -> list[list[Hit]]
    out["recall"], out["recall_lo"], out["recall_hi"]   # percent, 95% bootstrap CI

recall@k: the share of a question's `gold_passage_ids` among its top k (questions without gold
ids are left out of it). answer@k: whether any gold answer occurs (SQuAD-normalised) in the top
k passages' title + text; yes/no questions are left out of it, since "yes" is in everything.
"""
from __future__ import annotations

import re
import time

from ragrl.datasets import load_questions, with_heuristic_gold
from ragrl.eval.batches import SEARCH_BATCH, in_batches
from ragrl.eval.cells import ci_cell, diff_cell, markdown_table
from ragrl.eval.stats import bootstrap_ci, paired_record
from ragrl.rewards.qa import answer_in, is_yes_no  # noqa: F401  (re-exported: eval code imports them here)
from ragrl.rewards.search import gold_recall

# The held-out multi-hop sets whose evidence passages are in the data kit's corpus. 2Wiki's
# evidence is the kit's heuristic (`with_heuristic_gold`); reports say so.
HELD_OUT_SETS = {"hotpotqa_dev": "kit:eval/hotpotqa_dev.jsonl.gz", "musique_dev": "kit:eval/musique_dev.jsonl.gz",
                 "2wikimultihopqa_dev": "kit:eval/2wikimultihopqa_dev.jsonl.gz"}


def load_held_out(sets: dict[str, str] | None = None) -> dict[str, list[dict]]:
    """{name: questions} of `sets` (default HELD_OUT_SETS), heuristic evidence as gold where the
    rows have no gold passages."""

    return {name: with_heuristic_gold(load_questions(path)) for name, path in (sets or HELD_OUT_SETS).items()}


def retrieval_eval(search, samples: list[dict], k: int, *, per_question: bool = False,
                   batch_size: int = SEARCH_BATCH, hop_size: int | None = None, hits_out: dict | None = None) -> dict:
    """Deterministic top-k for every question (the question as the query); metrics in percent.

    `search` may return several hops' passages in hop order (k · hops); all of them are scored.
    hop_size (the passages each hop adds) gives the per-hop breakdown: for each hop h, the share
    of questions whose first gold passage (`gold_hop{h}`) or first answer-bearing passage
    (`answer_hop{h}`) came from hop h. hits_out, a dict, receives {id: [Hit]} (the passages
    themselves, e.g. for `ragrl.eval.retriever_view.retrieval_rows`; the result keeps only ids)."""
    t0 = time.perf_counter()
    hits = in_batches(samples, batch_size, lambda batch: search([q["question"] for q in batch], k))
    rows = {}
    for q, hs in zip(samples, hits):
        row = {"hits": [h.id for h in hs]}
        if q.get("gold_passage_ids"):
            row["recall"] = gold_recall([h.id for h in hs], q["gold_passage_ids"])
            if hop_size:
                golds = set(q["gold_passage_ids"])
                row["gold_hop"] = next((1 + i // hop_size for i, h in enumerate(hs) if h.id in golds), 0)
        if not is_yes_no(q["answers"]):
            texts = [f"{h.title}. {h.text}" for h in hs]
            row["answer_at_k"] = answer_in(texts, q["answers"])
            if hop_size:
                row["answer_hop"] = next((1 + i // hop_size for i, t in enumerate(texts)
                                          if answer_in([t], q["answers"])), 0)
        rows[str(q["id"])] = row
        if hits_out is not None:
            hits_out[str(q["id"])] = hs
    out = {**summarize_rows(rows, hop_size), "retrieval_wall_s": time.perf_counter() - t0}
    out["k"] = max([k] + [len(hs) for hs in hits])   # the passages the reader is given (every hop's)
    if per_question:
        out["per_question"] = rows
    return out


def summarize_rows(rows: dict, hop_size: int | None = None) -> dict:
    """`retrieval_eval`'s metrics from its per-question rows ({id: row}), e.g. several sets' rows
    pooled without searching again: n, recall and answer@k with 95% CIs (percent), and with
    hop_size the per-hop shares (`gold_hop{h}`, `answer_hop{h}`)."""
    out = {"k": max((len(r["hits"]) for r in rows.values()), default=0), "n": len(rows)}
    for key in ("recall", "answer_at_k"):
        vals = [r[key] for r in rows.values() if key in r]
        if vals:
            m, lo, hi = bootstrap_ci(vals)
            out.update({key: 100 * m, f"{key}_lo": 100 * lo, f"{key}_hi": 100 * hi, f"{key}_n": len(vals)})
    if hop_size:
        hops = out["k"] // hop_size
        for key in ("gold_hop", "answer_hop"):
            vals = [r[key] for r in rows.values() if key in r]
            for h in range(1, hops + 1):
                if vals:
                    out[f"{key}{h}"] = 100 * sum(v == h for v in vals) / len(vals)
    return out


def summary_ci(summary: dict, key: str) -> dict | None:
    """`key`'s CI record ({mean, ci_lo, ci_hi}) from a `summarize_rows` summary, which keeps them flat
    (`recall`, `recall_lo`, `recall_hi`); None when the summary has no `key`.

    >>> summary_ci({"recall": 50.0, "recall_lo": 40.0, "recall_hi": 60.0}, "recall")
    {'mean': 50.0, 'ci_lo': 40.0, 'ci_hi': 60.0}
    """
    return {"mean": summary[key], "ci_lo": summary[f"{key}_lo"], "ci_hi": summary[f"{key}_hi"]} if key in summary else None


def compare_rows(rows: dict[str, dict], baseline: str, hop_size: int | None = None) -> dict:
    """`compare_retrievers`' result from per-question rows already computed ({system: {id: row}})."""
    out = {name: {**summarize_rows(r, hop_size), "per_question": r} for name, r in rows.items()}
    return {**out, **paired_against(rows, baseline)}


def paired_against(rows: dict[str, dict], baseline: str) -> dict:
    """{"paired": {system: {metric: paired_record}}, "changed": {system: {metric: {gained, lost}}}}
    of every system's per-question rows against `baseline`'s."""
    out: dict = {"paired": {}, "changed": {}}
    for name in rows:
        if name != baseline:
            out["paired"][name], out["changed"][name] = paired_rows(rows[baseline], rows[name])
    return out


def compare_retrievers(searches: dict, samples: list[dict], k: int, baseline: str, *,
                       hop_size: int | None = None, hits_out: dict | None = None) -> dict:
    """Evaluate several retrievers on the same questions; paired differences against `baseline`.

    searches: {name: search(queries, k)}. Returns {name: metrics, "paired": {name: {metric:
    paired_record}}, "changed": {name: {gained, lost}}} with metrics in percent; `gained`
    counts questions whose top k holds a gold passage (or the answer) only with `name`.
    hits_out, a dict, receives {name: {id: [Hit]}} (see `retrieval_eval`)."""
    out = {name: retrieval_eval(fn, samples, k, per_question=True, hop_size=hop_size,
                                hits_out=None if hits_out is None else hits_out.setdefault(name, {}))
           for name, fn in searches.items()}
    return {**out, **paired_against({name: out[name]["per_question"] for name in searches}, baseline)}


def paired_rows(base: dict, new: dict, keys: tuple[str, ...] = ("recall", "answer_at_k")) -> tuple[dict, dict]:
    """Two systems' per-question rows ({id: {metric: 0-1}}) → ({metric: paired_record} in
    percent, {metric: {gained, lost}}) for each metric in `keys`, over the questions both have it for.

    >>> paired, changed = paired_rows({"a": {"f1": 0.0}, "b": {"f1": 0.5}}, {"a": {"f1": 1.0}, "b": {"f1": 0.5}},
    ...                               keys=("f1",))
    >>> paired["f1"]["diff"], changed["f1"]
    (50.0, {'gained': 1, 'lost': 0})
    """

    paired, changed = {}, {}
    for key in keys:
        ids = [q for q in base if key in base[q] and key in new.get(q, {})]
        if not ids:
            continue
        paired[key] = paired_record([base[q][key] for q in ids], [new[q][key] for q in ids])
        changed[key] = {"gained": sum(new[q][key] > base[q][key] for q in ids),
                        "lost": sum(new[q][key] < base[q][key] for q in ids)}
    return paired, changed


def question_kind(q: dict) -> str:
    """The question's type where the data has one (HotpotQA: bridge / comparison; MuSiQue: 2hop…),
    else yes/no or other, from the gold answers.

    >>> question_kind({"type": "bridge", "answers": ["x"]}), question_kind({"id": "3hop1__9", "answers": ["x"]})
    ('bridge', '3hop')
    >>> question_kind({"answers": ["yes"]})
    'yes/no'
    """
    if q.get("type"):
        return str(q["type"])
    hop = re.match(r"(\d)hop\d*__", str(q.get("id", "")))   # MuSiQue ids: 2hop__…, 3hop1__…
    if hop:
        return f"{hop.group(1)}hop"
    return "yes/no" if is_yes_no(q.get("answers") or []) else "other"


def by_question_kind(samples: list[dict], base_rows: dict, new_rows: dict, key: str = "recall") -> list[dict]:
    """Per question kind: n, the mean `key` (percent) of two retrievers' per-question rows, and the
    questions where `key` rose (gained) or fell (lost): a regression on one kind shows here first."""
    groups: dict[str, list[tuple[float, float]]] = {}
    for q in samples:
        b, n = base_rows.get(str(q["id"]), {}), new_rows.get(str(q["id"]), {})
        if key in b and key in n:
            groups.setdefault(question_kind(q), []).append((b[key], n[key]))
    return [{"kind": kind, "n": len(v), "base": 100 * sum(x for x, _ in v) / len(v),
             "new": 100 * sum(y for _, y in v) / len(v), "gained": sum(y > x for x, y in v),
             "lost": sum(y < x for x, y in v)} for kind, v in sorted(groups.items())]


def format_comparison(result: dict, names: list[str], baseline: str, title: str = "") -> str:
    """A markdown table: each retriever's recall@k / answer@k with CIs, and the paired difference."""
    k = result[baseline]["k"]
    rows = []
    for name in names:
        r, cells = result[name], [name]
        for key in ("recall", "answer_at_k"):
            if key not in r:
                cells += ["–", "–"]
                continue
            cells.append(f"{ci_cell(summary_ci(r, key))} (n={r[key + '_n']})")
            pd = result.get("paired", {}).get(name, {}).get(key)
            cells.append(diff_cell(pd, with_p=True) if pd else "–")
        rows.append(cells)
    header = ["retriever", f"gold recall@{k}", f"Δ vs {baseline} [95% CI], p", f"answer@{k}",
              f"Δ vs {baseline} [95% CI], p"]
    lines = [f"### {title}" if title else "", "", *markdown_table(header, rows)]
    return "\n".join(lines).strip() + "\n"
