"""Code the MMOA-RAG experiment scripts share: the evaluation sets, the paired metrics, and the
per-question results that `mmoa_eval` cached, pooled over question ranges.

Imported as `experiments.mmoa.common`: run the scripts from the repository root as modules
(`python -m experiments.mmoa.mmoa_combine ...`).
"""
from __future__ import annotations

import json
from pathlib import Path

SETS = {"hotpotqa_dev": "kit:eval/hotpotqa_dev.jsonl.gz", "musique_dev": "kit:eval/musique_dev.jsonl.gz",
        # Not in the default: no official gold ids (selector metrics use the kit's heuristic evidence).
        "2wikimultihopqa_dev": "kit:eval/2wikimultihopqa_dev.jsonl.gz",
        # Not held out: the 200 questions that chose every kept step. For diagnostics only, e.g. whether a
        # GPU run's pool-dev gain reproduces when decoded here on the CPU.
        "pool-dev": "pool-dev"}
DEFAULT_SETS = ("hotpotqa_dev", "musique_dev")
# The paired tests against the SFT start: answer F1 and selector F1.
PAIRED = ("f1", "selector_f1")


def _entries(part: Path) -> dict[str, dict[str, list[dict]]]:
    """set -> adapter digest -> cache entries (one adapter may be cached under several names), for one
    --part; naive RAG, keyed by no adapter, left out."""
    root = part.with_suffix(".cache")
    if not root.is_dir():
        raise SystemExit(f"--part {part}: no cache folder {root} "
                         f"(run python -m experiments.mmoa.mmoa_eval --out {part} first)")
    out: dict[str, dict[str, list[dict]]] = {}
    for set_dir in sorted(p for p in root.iterdir() if p.is_dir()):
        for f in sorted(set_dir.glob("*.json")):
            d = json.loads(f.read_text())
            if d["name"] != "naive_rag":
                out.setdefault(set_dir.name, {}).setdefault(d["adapter"], []).append(d)
    return out


def collect(parts: list[Path], digests: dict[str, str]):
    """Every system's per-question metrics, pooled over `parts` in order: (set -> system -> [metric
    dict a question], set -> [(first index, end index, part)], system -> adapter digest). `digests`:
    system label -> adapter digest, the SFT start's labelled "SFT". Refuses a system missing from a
    part, overlapping question ranges, parts decoded with other settings and an adapter cached
    twice with different results."""
    names = list(digests)
    per_set: dict[str, dict[str, list[dict]]] = {}
    spans: dict[str, list[tuple[int, int, str]]] = {}
    adapters: dict[str, str] = {}
    settings = None   # every part's decoding settings (its key without the range) must be the first part's
    for part in parts:
        for set_name, systems in _entries(part).items():
            missing = [n for n in names if digests[n] not in systems]
            if missing:
                raise SystemExit(f"--part {part}, {set_name}: no cached result for {', '.join(missing)}")
            key = systems[digests["SFT"]][0]["key"]
            start, n = key["rollout"].get("skip", 0), key["n"]
            mine = {k: v for k, v in key["rollout"].items() if k != "skip"}
            if settings is not None and mine != settings:
                raise SystemExit(f"--part {part}, {set_name}: evaluated with other settings than the first part "
                                 f"({mine} against {settings}): their scores cannot be pooled")
            settings = mine
            for lo, hi, other in spans.get(set_name, []):
                if start < hi and lo < start + n:
                    raise SystemExit(f"{set_name}: questions {start + 1}-{start + n} of {part} overlap "
                                     f"{lo + 1}-{hi} of {other}")
            spans.setdefault(set_name, []).append((start, start + n, str(part)))
            for name in names:
                same = [e for e in systems[digests[name]] if e["key"] == key]
                if not same:
                    raise SystemExit(f"--part {part}, {set_name}: {name} was evaluated with other settings than SFT")
                if any(e["summary"] != same[0]["summary"] for e in same[1:]):
                    # The same adapter decoded twice (e.g. with another thread count: bf16 rounding can
                    # flip a rare greedy tie); pooling whichever came first would be a silent choice.
                    raise SystemExit(f"--part {part}, {set_name}: {name}'s adapter is cached under several names "
                                     f"({', '.join(repr(e['name']) for e in same)}) with different results; "
                                     "remove all but the one to report")
                e = same[0]
                adapters[name] = e["adapter"]
                if len(e["summary"]) != n:
                    raise SystemExit(f"--part {part}, {set_name}: {name} has {len(e['summary'])} results, not {n}")
                per_set.setdefault(set_name, {}).setdefault(name, []).extend(e["summary"])
    return per_set, spans, adapters
