"""Corpus loading: every malformed input is a CorpusError naming the file and the line."""
import gzip
import hashlib
import json

import pytest

from ragrl.errors import CorpusError, RagrlError
from ragrl.paths import DEMO_CORPUS
from ragrl.retrieval.corpus import load_corpus

GOOD = [
    {"id": "a", "title": "Alpha", "text": "first passage", "sources": ["x"]},
    {"id": "b", "title": "", "text": "second passage"},
    {"id": "c", "title": "Gamma", "text": "third passage"},
]


def _jsonl(rows) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


def test_plain_and_gzip_load_the_same_passages(tmp_path):
    text = _jsonl(GOOD[:2]) + "\n   \n" + _jsonl(GOOD[2:])  # blank lines are skipped
    plain = tmp_path / "c.jsonl"
    plain.write_text(text)
    packed = tmp_path / "c.jsonl.gz"
    packed.write_bytes(gzip.compress(text.encode()))

    a, b = load_corpus(plain), load_corpus(packed)
    assert a.ids == b.ids == ["a", "b", "c"]
    assert a.titles == b.titles == ["Alpha", "", "Gamma"]
    assert a.texts == b.texts
    assert len(a) == 3
    assert a.sha256 == hashlib.sha256(plain.read_bytes()).hexdigest()
    assert b.sha256 == hashlib.sha256(packed.read_bytes()).hexdigest() != a.sha256
    assert a.get("c") == {"id": "c", "title": "Gamma", "text": "third passage"}  # extra fields dropped
    assert a.get("zzz") is None
    assert a.passage(1) == {"id": "b", "title": "", "text": "second passage"}
    assert a.hit(0, 2.5).contents == '"Alpha"\nfirst passage'


def test_bundled_demo_corpus_loads():
    corpus = load_corpus(DEMO_CORPUS)
    assert len(corpus) == 8336
    assert len(set(corpus.ids)) == 8336
    assert all(corpus.texts)


# (line 2 content, expected message fragment); line 1 is always a good row.
MALFORMED = {
    "bad json": ('{"id": "x", "title": "t", "text": ', "invalid JSON"),
    "not an object": ('["x", "t", "text"]', "expected a JSON object, got list"),
    "missing text": ('{"id": "x", "title": "t"}', 'missing field "text"'),
    "missing id": ('{"title": "t", "text": "y"}', 'missing field "id"'),
    "missing title": ('{"id": "x", "text": "y"}', 'missing field "title"'),
    "text not a string": ('{"id": "x", "title": "t", "text": 7}', 'field "text" must be a string, got int'),
    "id not a string": ('{"id": 12, "title": "t", "text": "y"}', 'field "id" must be a string, got int'),
    "title null": ('{"id": "x", "title": null, "text": "y"}', 'field "title" must be a string, got NoneType'),
    "empty id": ('{"id": "  ", "title": "t", "text": "y"}', 'empty "id"'),
    "duplicate id": ('{"id": "a", "title": "t", "text": "y"}', 'duplicate id "a" (first seen on line 1)'),
}


@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gz"])
@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_line_names_file_and_line(tmp_path, case, gz):
    bad_line, fragment = MALFORMED[case]
    # A blank line before the bad one: line numbers must still count it.
    data = (_jsonl(GOOD[:1]) + "\n" + bad_line + "\n" + _jsonl(GOOD[2:])).encode()
    path = tmp_path / ("corpus.jsonl.gz" if gz else "corpus.jsonl")
    path.write_bytes(gzip.compress(data) if gz else data)
    with pytest.raises(CorpusError) as err:
        load_corpus(path)
    assert f"{path}:3: " in str(err.value)
    assert fragment in str(err.value)
    assert isinstance(err.value, RagrlError)


def test_invalid_utf8_names_the_line(tmp_path):
    path = tmp_path / "corpus.jsonl"
    path.write_bytes(_jsonl(GOOD[:2]).encode() + b'{"id": "z", "title": "t", "text": "caf\xe9"}\n')
    with pytest.raises(CorpusError, match=r"corpus\.jsonl:3: invalid UTF-8"):
        load_corpus(path)


def test_missing_empty_and_broken_files(tmp_path):
    with pytest.raises(CorpusError, match="nope.jsonl: corpus file not found"):
        load_corpus(tmp_path / "nope.jsonl")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n \n\n")
    with pytest.raises(CorpusError, match="empty.jsonl: corpus is empty"):
        load_corpus(empty)
    truncated = tmp_path / "cut.jsonl.gz"
    truncated.write_bytes(gzip.compress(_jsonl(GOOD).encode())[:-10])
    with pytest.raises(CorpusError, match="cut.jsonl.gz: not a valid gzip file"):
        load_corpus(truncated)
    with pytest.raises(CorpusError, match="cannot read corpus file"):
        load_corpus(tmp_path)  # a directory
