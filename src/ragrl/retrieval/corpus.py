"""A passage corpus: JSON Lines (optionally gzip) with `id`, `title`, `text` per line.

Every problem in the file is reported as a `CorpusError` naming the file and the 1-based line,
so a typo on line 40,000 of a corpus is found in seconds instead of by a silent bad index.
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ragrl.errors import CorpusError
from ragrl.jsonl import iter_json_objects
from ragrl.retrieval.base import Hit
from ragrl.retrieval.passage_file import PassageFile, file_sha256

__all__ = ["Corpus", "load_corpus", "open_corpus_on_disk", "file_sha256", "write_corpus"]

REQUIRED_FIELDS = ("id", "title", "text")


@dataclass
class Corpus:
    """Passages by row; row i is passage i of every index built on it. In memory, `ids`, `titles`
    and `texts` are three parallel lists; a corpus on disk (`open_corpus_on_disk`) reads each row
    from its file by offset, and the three are read-only views of it."""

    ids: Sequence[str]
    titles: Sequence[str]
    texts: Sequence[str]
    sha256: str  # of the file bytes as stored on disk (compressed bytes for .gz)
    path: str = ""
    store: PassageFile | None = None  # set for a corpus on disk
    _row_of_id: dict[str, int] | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # A corpus on disk finds a row by binary search over its sorted ids, not a dict of 21M strings.
        self._row_of_id = None if self.store is not None else {pid: i for i, pid in enumerate(self.ids)}

    def __len__(self) -> int:
        return len(self.ids)

    def row(self, pid: str) -> int | None:
        """Row number of passage `pid`, or None if the corpus has no such id."""
        return self.store.row(pid) if self._row_of_id is None else self._row_of_id.get(pid)

    def passage(self, i: int) -> dict:
        if self.store is not None:
            return self.store.record(i)
        return {"id": self.ids[i], "title": self.titles[i], "text": self.texts[i]}

    def get(self, pid: str) -> dict | None:
        """The passage with id `pid` as a dict, or None (like `dict.get`)."""
        i = self.row(pid)
        return None if i is None else self.passage(i)

    def hit(self, i: int, score: float) -> Hit:
        p = self.passage(i)
        return Hit(id=p["id"], title=p["title"], text=p["text"], score=float(score))


def open_corpus_on_disk(path: str | Path, table_dir: str | Path, sha256: str) -> Corpus:
    """A plain JSON Lines corpus read by offset, through the passage table in `table_dir` (written by
    `passage_file.write_passage_table(path, table_dir, passage_fields)`); `sha256` as recorded then."""
    store = PassageFile(path, table_dir, passage_fields)
    return Corpus(ids=store.column("id"), titles=store.column("title"), texts=store.column("text"),
                  sha256=sha256, path=str(path), store=store)


def load_corpus(path: str | Path) -> Corpus:
    """Read and validate a corpus file: rows of `id`, `title`, `text` (extra fields such as `sources`
    are ignored), or FlashRAG / Search-R1 rows of `id`, `contents` ("\"Title\"\ntext")."""
    path = Path(path)
    name = str(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise CorpusError(f"{name}: corpus file not found") from None
    except OSError as e:
        raise CorpusError(f"{name}: cannot read corpus file ({e.strerror or e})") from None
    sha = hashlib.sha256(raw).hexdigest()

    ids: list[str] = []
    titles: list[str] = []
    texts: list[str] = []
    first_line_of: dict[str, int] = {}
    for lineno, row in iter_json_objects(raw, name, CorpusError):
        row = passage_fields(row, f"{name}:{lineno}")
        pid = row["id"]
        if pid in first_line_of:
            raise CorpusError(
                f'{name}:{lineno}: duplicate id "{pid}" (first seen on line {first_line_of[pid]})'
            )
        first_line_of[pid] = lineno
        ids.append(pid)
        titles.append(row["title"])
        texts.append(row["text"])

    if not ids:
        raise CorpusError(f"{name}: corpus is empty (no passages)")
    return Corpus(ids=ids, titles=titles, texts=texts, sha256=sha, path=name)


def passage_fields(row: dict, where: str) -> dict:
    """A corpus row's {"id", "title", "text"} (either layout), or a CorpusError naming `where`."""
    row = _from_contents(row, where)
    _check_fields(row, where)
    return {key: row[key] for key in REQUIRED_FIELDS}


def _from_contents(row: dict, where: str) -> dict:
    r"""FlashRAG's / Search-R1's corpus rows (the wiki-18 layout): `{"id", "contents": "\"Title\"\ntext"}`
    become id/title/text; a row with both layouts is ambiguous and refused.

    >>> _from_contents({"id": 0, "contents": '"Jaws (film)"\nJaws is a 1975 film.'}, "x:1")
    {'id': '0', 'title': 'Jaws (film)', 'text': 'Jaws is a 1975 film.'}
    >>> _from_contents({"id": "7", "contents": "no title line"}, "x:1")["title"]
    ''
    """
    if not isinstance(row, dict) or "contents" not in row:
        return row
    if "title" in row or "text" in row:
        raise CorpusError(f'{where}: a row has either "contents" (FlashRAG) or "title"/"text", not both')
    contents = row["contents"]
    if not isinstance(contents, str):
        raise CorpusError(f'{where}: field "contents" must be a string, got {type(contents).__name__}')
    first, sep, rest = contents.partition("\n")
    if sep and len(first) >= 2 and first.startswith('"') and first.endswith('"'):
        title, text = first[1:-1], rest
    else:
        title, text = "", contents
    pid = row.get("id")
    if isinstance(pid, int) and not isinstance(pid, bool):
        pid = str(pid)   # wiki-18's ids are numbers
    return {"id": pid, "title": title, "text": text}


def _check_fields(row: dict, where: str) -> None:
    for key in REQUIRED_FIELDS:
        if key not in row:
            raise CorpusError(f'{where}: missing field "{key}"')
        if not isinstance(row[key], str):
            raise CorpusError(f'{where}: field "{key}" must be a string, got {type(row[key]).__name__}')
    if not row["id"].strip():
        raise CorpusError(f'{where}: empty "id"')


def write_corpus(corpus: Corpus, path: str | Path) -> None:
    """Write passages as plain JSON Lines (id, title, text): handy for tests and slicing corpora."""
    with open(path, "w", encoding="utf-8") as f:
        for i in range(len(corpus)):
            f.write(json.dumps(corpus.passage(i), ensure_ascii=False) + "\n")
