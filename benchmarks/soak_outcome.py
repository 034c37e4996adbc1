"""What a soak run ends with against its uninterrupted reference (benchmarks/soak.py): its metrics rows,
its kept artifacts and its weights, wall-clock readings aside."""
from __future__ import annotations

import json
from pathlib import Path

# Files whose bytes hold wall-clock time or this run's own path: compared as data, or not at all.
NOT_COMPARED = ("train.log", "training.json", "config.yaml", "curves.png")


def wall_clock(key: str) -> bool:
    return "time" in key or "wall" in key or key.endswith(("_s", "per_s")) or key == "date"


def without_wall_clock(value):
    if isinstance(value, dict):
        return {k: without_wall_clock(v) for k, v in value.items() if not wall_clock(k)}
    if isinstance(value, list):
        return [without_wall_clock(v) for v in value]
    return value


def checkpoints(run_dir: Path) -> list[Path]:
    return sorted(p for p in (run_dir / "checkpoints").glob("step_*") if p.is_dir())


def same_rows(a: list[dict], b: list[dict]) -> tuple[bool, list[int]]:
    """(equal, the steps whose rows differ or are missing) without wall-clock readings."""
    a, b = without_wall_clock(a), without_wall_clock(b)
    differ = [i for i in range(max(len(a), len(b))) if i >= len(a) or i >= len(b) or a[i].keys() != b[i].keys()
              or any(abs(a[i][k] - b[i][k]) > 1e-6 + 1e-5 * abs(b[i][k]) for k in a[i])]
    return not differ, differ


def json_values(raw: bytes):
    """A JSON file's values, or a JSONL file's rows, without wall-clock fields."""
    text = raw.decode()
    try:
        return without_wall_clock(json.loads(text))
    except json.JSONDecodeError:
        return [without_wall_clock(json.loads(ln)) for ln in text.splitlines() if ln.strip()]


def artifacts(run_dir: Path) -> dict[str, Path]:
    return {str(p.relative_to(run_dir)): p for p in sorted(run_dir.rglob("*")) if p.is_file()
            and p.name not in NOT_COMPARED and "tb" not in p.relative_to(run_dir).parts}


def compare_artifacts(soak_dir: Path, ref_dir: Path) -> dict:
    """The same files; each with the same bytes, or (JSON, JSONL) the same values without wall-clock fields."""
    mine, theirs = artifacts(soak_dir), artifacts(ref_dir)
    differ = []
    for rel in sorted(set(mine) & set(theirs)):
        a, b = mine[rel].read_bytes(), theirs[rel].read_bytes()
        if a == b:
            continue
        if rel.endswith((".json", ".jsonl")) and json_values(a) == json_values(b):
            continue
        differ.append(rel)
    return {"files": len(theirs), "only_in_soak": sorted(set(mine) - set(theirs)),
            "only_in_reference": sorted(set(theirs) - set(mine)), "differ": differ,
            "equal": mine.keys() == theirs.keys() and not differ}


def compare_weights(soak_dir: Path, ref_dir: Path) -> dict:
    """Every tensor of the final and best adapters (and value heads) and of the newest checkpoint."""
    from safetensors.torch import load_file

    diffs = {}
    for ref_file in sorted(ref_dir.glob("*_adapter/*.safetensors")) + sorted(checkpoints(ref_dir)[-1].glob("*.safetensors")):
        rel = ref_file.relative_to(ref_dir)
        a, b = load_file(str(soak_dir / rel)) if (soak_dir / rel).exists() else {}, load_file(str(ref_file))
        diffs[str(rel)] = max((float((a[k] - b[k]).abs().max()) if k in a and a[k].shape == b[k].shape
                               else float("inf") for k in b), default=0.0)
    worst = max(diffs.values(), default=float("inf"))
    return {"files": len(diffs), "max_abs_diff": worst, "equal": worst == 0.0}
