"""What the data kit holds and whether it is intact: every file against the kit's `manifest.json`
(sha256, size, rows, sources, licence). `ragrl data` prints it; the tests and `--check` read it.

The kit is `$RAGRL_DATA` or the installed `ragrl-data` package (ragrl.paths.data_kit). A kit in
another layout's manifest (only `files: {path: {sha256, bytes}}`) is verified as far as it says."""
from __future__ import annotations

import gzip
import hashlib
import json
import os
import zlib
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as dist_version
from pathlib import Path

import numpy as np

from ragrl.errors import RagrlError
from ragrl.paths import data_kit, ragrl_data

MANIFEST = "manifest.json"
# Files of a kit folder that are not data (the manifest itself and the package's own files).
NOT_DATA = {MANIFEST, "README.md", "__init__.py"}


@dataclass
class KitFile:
    """One file of the kit as found on disk and as its manifest declares it."""

    path: str                          # relative to the kit root, e.g. eval/hotpotqa_dev.jsonl.gz
    status: str                        # ok | changed | missing | unlisted (on disk, not in the manifest)
    bytes: int = 0
    rows: int | None = None            # lines of a .jsonl(.gz), first dimension of a .npy
    licence: str = ""
    sources: list[str] = field(default_factory=list)
    what: str = ""


@dataclass
class KitReport:
    root: Path
    origin: str                        # "$RAGRL_DATA" or "ragrl-data <version>"
    licence: str
    files: list[KitFile]
    sources: list[dict]

    @property
    def problems(self) -> list[str]:
        """"path (changed|missing)" for every listed file not there as its manifest says (an unlisted
        extra is reported, not verified, so it is no problem)."""
        return [f"{f.path} ({f.status})" for f in self.files if f.status in ("changed", "missing")]

    @property
    def intact(self) -> bool:
        return not self.problems

    def check(self) -> "KitReport":
        """This report, or a RagrlError naming every changed or missing file."""
        if self.problems:
            raise RagrlError(f"the data kit at {self.root} does not match its manifest: {', '.join(self.problems)}")
        return self


def count_rows(path: Path) -> int | None:
    """Lines of a JSON Lines file (.gz ok) or the first dimension of a .npy; None for other files
    and for a file too damaged to read (its checksum already says so)."""
    try:
        return _rows(path)
    except (OSError, EOFError, ValueError, zlib.error):
        return None


def _rows(path: Path) -> int | None:
    name = path.name
    if name.endswith((".jsonl", ".jsonl.gz")):
        opener = gzip.open if name.endswith(".gz") else open
        with opener(path, "rt", encoding="utf-8") as handle:
            return sum(1 for line in handle if line.strip())
    if name.endswith(".npy"):
        return int(np.load(path, mmap_mode="r").shape[0])
    return None


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _origin(root: Path) -> str:
    if os.environ.get("RAGRL_DATA"):
        return "$RAGRL_DATA"
    version = "?"
    if ragrl_data is not None:
        try:
            version = dist_version("ragrl-data")
        except PackageNotFoundError:   # a source tree on sys.path, not installed: no dist metadata
            pass
    return f"ragrl-data {version}"


def inspect_kit(root: Path | None = None) -> KitReport:
    """Every file of the kit at `root` (default: the one ragrl reads) checked against its manifest."""
    root = Path(root) if root is not None else data_kit()
    manifest_path = root / MANIFEST
    if not manifest_path.is_file():
        raise RagrlError(f"{root}: no {MANIFEST}; a data kit lists its files, sizes and sha256 there")
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        declared = manifest["files"]
        if not isinstance(declared, dict):
            raise TypeError("'files' is not a mapping")
    except (ValueError, KeyError, TypeError) as e:
        raise RagrlError(f"{manifest_path}: not a kit manifest ({e})") from None

    files = []
    for rel, meta in sorted(declared.items()):
        path = root / rel
        entry = KitFile(rel, "missing", licence=meta.get("licence", ""), sources=list(meta.get("sources", [])),
                        what=meta.get("what", ""))
        if path.is_file():
            entry.bytes = path.stat().st_size
            intact = entry.bytes == meta.get("bytes", entry.bytes) and sha256_of(path) == meta.get("sha256")
            entry.status = "ok" if intact else "changed"
            entry.rows = meta["rows"] if intact and "rows" in meta else count_rows(path)
        files.append(entry)
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        rel = path.relative_to(root).as_posix()
        if rel not in declared and path.name not in NOT_DATA and "__pycache__" not in path.parts:
            files.append(KitFile(rel, "unlisted", path.stat().st_size, count_rows(path)))
    return KitReport(root, _origin(root), manifest.get("licence", ""), files, list(manifest.get("sources", [])))


def verify_kit(root: Path | None = None) -> KitReport:
    """inspect_kit, raising a RagrlError that names every changed or missing file."""
    return inspect_kit(root).check()
