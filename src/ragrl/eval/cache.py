"""Per-system evaluation results on disk, for scripts that compare adapters on held-out questions:
a killed run, or one more adapter, re-evaluates only what changed.

An entry is keyed by the system's name, its adapter's content hash (`adapter_digest`: a retrained
adapter at the same path is re-evaluated) and the settings that shape the result (n, rollout, dtype);
a mismatch is a miss. A cache is one folder, one JSON file per system name:
``{"name", "adapter", "key": {"n", "rollout"}, "summary"}``, written atomically.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

from ragrl.errors import RagrlError


def adapter_digest(adapter_dir: str) -> str:
    """Content hash of an adapter folder: file names and bytes, per-agent subfolders included.

    Raises RagrlError when the folder does not exist.
    """
    root = Path(adapter_dir)
    if not root.is_dir():
        raise RagrlError(f"adapter folder {adapter_dir} does not exist")
    h = hashlib.sha1()
    for f in sorted(p for p in root.rglob("*") if p.is_file()):
        h.update(str(f.relative_to(root)).encode() + b"\0")
        h.update(f.read_bytes())
    return h.hexdigest()


class Cache:
    """One folder of entries, one JSON file per system name; `get` misses on any key mismatch."""

    def __init__(self, root: Path, n: int, settings: dict):
        self.root, self.key = root, json.loads(json.dumps({"n": n, "rollout": settings}))   # as stored
        root.mkdir(parents=True, exist_ok=True)

    def _file(self, name: str) -> Path:
        return self.root / (hashlib.sha1(name.encode()).hexdigest()[:16] + ".json")

    def get(self, name: str, adapter_key: str):
        """The stored summary of `name`, or None unless its adapter key and settings match."""
        f = self._file(name)
        if not f.exists():
            return None
        d = json.loads(f.read_text())
        ok = d.get("name") == name and d.get("adapter") == adapter_key and d.get("key") == self.key
        return d["summary"] if ok else None

    def put(self, name: str, adapter_key: str, summary) -> None:
        """Store `summary` for `name` under this cache's settings (replacing any earlier entry)."""
        f = self._file(name)
        tmp = f.with_suffix(".tmp")
        tmp.write_text(json.dumps({"name": name, "adapter": adapter_key, "key": self.key, "summary": summary},
                                  default=str))
        tmp.replace(f)   # atomic: a killed run never leaves a half-written entry
