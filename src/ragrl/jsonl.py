"""JSON Lines reading shared by corpora and question files: every error names file and line."""
from __future__ import annotations

import gzip
import json
import zlib
from collections.abc import Iterator

from ragrl.errors import RagrlError

GZIP_MAGIC = b"\x1f\x8b"


def iter_json_objects(raw: bytes, name: str, error: type[RagrlError] = RagrlError) -> Iterator[tuple[int, dict]]:
    """(1-based line number, object) for each non-blank line of `raw` (gzip detected by magic bytes).

    >>> list(iter_json_objects(b'{"a": 1}\\n\\n{"b": 2}\\n', "f.jsonl"))
    [(1, {'a': 1}), (3, {'b': 2})]
    """
    # Detect gzip by its magic bytes rather than the suffix, so a renamed file still loads.
    if raw[:2] == GZIP_MAGIC:
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as e:
            raise error(f"{name}: not a valid gzip file ({e})") from None
    for lineno, line_bytes in enumerate(raw.split(b"\n"), start=1):
        if (row := parse_json_line(line_bytes, name, lineno, error)) is not None:
            yield lineno, row


def iter_json_file(path, error: type[RagrlError] = RagrlError) -> Iterator[tuple[int, dict]]:
    """iter_json_objects over a file read a line at a time (gzip or plain): a 100 MB file is never
    held whole."""
    with open(path, "rb") as probe:
        gzipped = probe.read(2) == GZIP_MAGIC
    try:
        with (gzip.open if gzipped else open)(path, "rb") as f:
            for lineno, line_bytes in enumerate(f, start=1):
                if (row := parse_json_line(line_bytes, str(path), lineno, error)) is not None:
                    yield lineno, row
    except (gzip.BadGzipFile, zlib.error, EOFError) as e:   # only a gzip stream raises these
        raise error(f"{path}: not a valid gzip file ({e})") from None


def parse_json_line(line_bytes: bytes, name: str, lineno: int, error: type[RagrlError]) -> dict | None:
    """One line's object, None for a blank line; anything else is an error naming file and line."""
    try:
        line = line_bytes.decode("utf-8")
    except UnicodeDecodeError as e:
        raise error(f"{name}:{lineno}: invalid UTF-8 at byte {e.start}") from None
    if not line.strip():
        return None
    try:
        row = json.loads(line)
    except json.JSONDecodeError as e:
        raise error(f"{name}:{lineno}: invalid JSON ({e.msg} at column {e.colno})") from None
    if not isinstance(row, dict):
        raise error(f"{name}:{lineno}: expected a JSON object, got {type(row).__name__}")
    return row
