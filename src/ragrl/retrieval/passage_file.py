"""A corpus on disk: passages read by byte offset from the plain JSON Lines file itself.

Wiki-18 (21M passages, ~13 GB of text) does not fit in memory as Python strings, and an index
should not hold a second copy of it. An index built over a plain (not gzipped) JSON Lines corpus
keeps a passage table beside its other files instead:

    passages/starts.npy     int64 [rows + 1]: the byte offset where row i starts; the last is the file size
    passages/ids.npy        bytes [rows]: each row's id, UTF-8 (fixed width: the longest id)
    passages/id_order.npy   int64 [rows]: rows sorted by id, for finding a row by its id (binary search)

All three are memory-mapped, and a passage is parsed from its line when it is asked for, so opening
the corpus costs the table's pages, not the corpus: ~25 bytes a passage (0.5 GB for wiki-18).

The corpus file is identified by its sha256, size and modification time, and a hash of 64 sampled
blocks (`fingerprint`); `check_unchanged` refuses a corpus whose size or sampled blocks differ, and
rehashes the whole file when its modification time moved (a copy or a `touch` is fine).
"""
from __future__ import annotations

import bisect
import hashlib
import json
import mmap
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ragrl.errors import CorpusError, IndexMismatchError
from ragrl.jsonl import GZIP_MAGIC, parse_json_line

TABLE_DIR = "passages"
STARTS, IDS, ID_ORDER = "starts.npy", "ids.npy", "id_order.npy"
SAMPLE_BLOCKS, SAMPLE_BLOCK_BYTES = 64, 1 << 16
# Smaller files are hashed whole on every load (the kit's 51k corpus: 0.1 s), as before passage tables.
FULL_HASH_MAX_BYTES = 256 << 20
_CHUNK_ROWS = 1 << 20  # ids are gathered a million at a time, never as 21M Python objects


def is_gzip(path: str | Path) -> bool:
    with open(path, "rb") as f:
        return f.read(2) == GZIP_MAGIC


def write_passage_table(path: str | Path, out_dir: str | Path, parse_row, *, progress=None) -> tuple[int, str]:
    """One streaming pass over a plain JSON Lines corpus: every row checked by `parse_row(obj, where)
    -> {"id", "title", "text"}` (the corpus loader's own checks, which raise CorpusError naming the
    line), the offset of each row recorded, and the file hashed. Writes the table into
    `out_dir/passages/` and returns (rows, sha256). `progress(bytes_read)` is called now and then."""
    path, table = Path(path), Path(out_dir) / TABLE_DIR
    if is_gzip(path):
        raise CorpusError(f"{path}: a gzipped corpus cannot be read by offset; gunzip it first")
    table.mkdir(parents=True, exist_ok=True)
    sha, starts, id_chunks, chunk = hashlib.sha256(), [], [], []
    offset = 0
    with open(path, "rb") as f:
        for lineno, line in enumerate(f, start=1):
            sha.update(line)
            row = parse_json_line(line, str(path), lineno, CorpusError)
            if row is not None:
                starts.append(offset)
                chunk.append(parse_row(row, f"{path}:{lineno}")["id"].encode("utf-8"))
                if len(chunk) == _CHUNK_ROWS:
                    id_chunks.append(np.array(chunk, dtype=bytes))
                    chunk = []
            offset += len(line)
            if progress is not None and lineno % 65536 == 0:
                progress(offset)
    if chunk:
        id_chunks.append(np.array(chunk, dtype=bytes))
    if not starts:
        raise CorpusError(f"{path}: corpus is empty (no passages)")
    width = max(c.dtype.itemsize for c in id_chunks)
    ids = np.concatenate([c.astype(f"S{width}") for c in id_chunks])
    order = np.argsort(ids, kind="stable")
    ordered = ids[order]
    same = np.flatnonzero(ordered[1:] == ordered[:-1])
    if same.size:
        first, dup = sorted(int(r) for r in order[same[0]: same[0] + 2])
        lines = _line_numbers(path, [starts[first], starts[dup]])
        raise CorpusError(f'{path}:{lines[1]}: duplicate id "{ids[dup].decode()}" (first seen on line {lines[0]})')
    np.save(table / STARTS, np.asarray(starts + [offset], dtype=np.int64))
    np.save(table / IDS, ids)
    np.save(table / ID_ORDER, order.astype(np.int64))
    return len(starts), sha.hexdigest()


def _line_numbers(path: Path, offsets: list[int]) -> list[int]:
    """1-based line numbers of byte offsets (for error messages only: one more pass)."""
    out = []
    for target in offsets:
        with open(path, "rb") as f:
            out.append(f.read(target).count(b"\n") + 1)
    return out


class PassageFile:
    """Rows of a plain JSON Lines corpus, read by offset through a memory map."""

    def __init__(self, path: str | Path, table_dir: str | Path, parse_row):
        self.path = Path(path)
        table = Path(table_dir) / TABLE_DIR
        try:
            self.starts = np.load(table / STARTS, mmap_mode="r")
            self.ids = np.load(table / IDS, mmap_mode="r")
            self.order = np.load(table / ID_ORDER, mmap_mode="r")
        except (OSError, ValueError) as e:
            raise CorpusError(f"{table}: passage table missing or corrupt ({e}); rebuild the index") from None
        rows = len(self.ids)
        if len(self.starts) != rows + 1 or len(self.order) != rows:
            raise CorpusError(f"{table}: passage table arrays disagree ({len(self.starts)} offsets, {rows} ids, "
                              f"{len(self.order)} order); rebuild the index")
        with open(self.path, "rb") as f:
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        if len(self._map) != int(self.starts[-1]):
            raise IndexMismatchError(f"{self.path} is {len(self._map)} bytes, but its passage table was made "
                                     f"for {int(self.starts[-1])}; the corpus changed, rebuild the index")
        self._parse_row = parse_row

    def __len__(self) -> int:
        return len(self.ids)

    def record(self, i: int) -> dict:
        """Row i as {"id", "title", "text"} (checked when the table was written)."""
        if not -len(self) <= i < len(self):
            raise IndexError(f"passage row {i} out of range ({len(self)} rows)")
        i %= len(self)
        return self._parse_row(json.loads(self._map[int(self.starts[i]):int(self.starts[i + 1])]), "")

    def row(self, pid: str) -> int | None:
        key = pid.encode("utf-8")
        pos = bisect.bisect_left(self.order, key, key=lambda r: self.ids[r])
        return int(self.order[pos]) if pos < len(self.order) and self.ids[self.order[pos]] == key else None

    def column(self, name: str) -> "PassageColumn":
        return PassageColumn(self, name)


class PassageColumn(Sequence):
    """One field of every row, as a read-only sequence (ids come from the table, the rest from the file)."""

    def __init__(self, passages: PassageFile, name: str):
        self.passages, self.name = passages, name

    def __len__(self) -> int:
        return len(self.passages)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if self.name == "id":
            return bytes(self.passages.ids[i]).decode("utf-8")
        return self.passages.record(i)[self.name]


def fingerprint(path: str | Path, sha256: str | None = None) -> dict:
    """What identifies a corpus file: its size, modification time, sha256 and a hash of 64 blocks
    sampled at fixed places (cheap to recheck on every load, whatever the file's size)."""
    path = Path(path)
    st = path.stat()
    return {"bytes": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": sha256 or file_sha256(path),
            "sample_sha256": _sample_sha256(path, st.st_size)}


def check_unchanged(path: str | Path, recorded: dict, *, what: str) -> None:
    """Refuse a corpus that is not the one `recorded` (a `fingerprint`) describes."""
    path = Path(path)
    try:
        st = path.stat()
    except OSError as e:
        raise CorpusError(f"{what}: cannot read its corpus {path} ({e.strerror or e})") from None
    if st.st_size <= FULL_HASH_MAX_BYTES:
        sha = file_sha256(path)
        if sha != recorded["sha256"]:
            raise IndexMismatchError(f"{what} was built from corpus sha256 {recorded['sha256']} "
                                     f"({recorded.get('path', path)}), but {path} has sha256 {sha}; rebuild the index")
        return
    if st.st_size != recorded["bytes"] or _sample_sha256(path, st.st_size) != recorded["sample_sha256"]:
        raise IndexMismatchError(f"{what} was built from corpus sha256 {recorded['sha256']} ({recorded.get('path', path)}), "
                                 f"but {path} is another file now ({st.st_size} bytes, {recorded['bytes']} then); "
                                 f"rebuild the index")
    if st.st_mtime_ns != recorded["mtime_ns"] and file_sha256(path) != recorded["sha256"]:
        raise IndexMismatchError(f"{what} was built from corpus sha256 {recorded['sha256']}, but {path} was "
                                 f"modified since and its sha256 differs; rebuild the index")


def _sample_sha256(path: Path, size: int) -> str:
    h = hashlib.sha256(str(size).encode())
    if size:
        places = np.linspace(0, max(size - SAMPLE_BLOCK_BYTES, 0), SAMPLE_BLOCKS).astype(np.int64)
        with open(path, "rb") as f:
            for at in sorted(set(places.tolist())):
                f.seek(at)
                h.update(f.read(SAMPLE_BLOCK_BYTES))
    return h.hexdigest()


def file_sha256(path: str | Path) -> str:
    """sha256 of a file's bytes, read in 8 MiB blocks (a corpus may be larger than memory)."""
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            while block := f.read(8 << 20):
                h.update(block)
    except OSError as e:
        raise CorpusError(f"{path}: cannot read corpus file ({e.strerror or e})") from None
    return h.hexdigest()
