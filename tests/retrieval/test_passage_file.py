"""A corpus on disk: passages read by offset through the index's passage table, never copied."""
import json
import os
import shutil

import pytest

from ragrl.errors import CorpusError, IndexMismatchError, RagrlError
from ragrl.paths import DEMO_CORPUS
from ragrl.retrieval.bm25 import BM25Index
from ragrl.retrieval.corpus import Corpus, load_corpus, passage_fields, write_corpus
from ragrl.retrieval.index import build_index, load_index
from ragrl.retrieval.passage_file import check_unchanged, fingerprint, write_passage_table

QUERIES = ["American singer album", "river in Europe", "football club", "1990s television series"]


@pytest.fixture(scope="module")
def plain_demo(tmp_path_factory):
    """2,000 demo passages as plain JSON Lines, with a blank line and a row in FlashRAG's layout."""
    path = tmp_path_factory.mktemp("corpus") / "demo.jsonl"
    demo = load_corpus(DEMO_CORPUS)
    write_corpus(Corpus(ids=demo.ids[:2000], titles=demo.titles[:2000], texts=demo.texts[:2000], sha256=""), path)
    with open(path, "a", encoding="utf-8") as f:
        f.write("\n" + json.dumps({"id": 9, "contents": '"Wiki 18"\nA row in the wiki-18 layout.'}) + "\n")
    return path


def test_corpus_on_disk_reads_what_memory_holds(plain_demo, tmp_path):
    out = build_index(plain_demo, tmp_path / "idx", progress=False)
    on_disk = load_index(out)
    memory = load_corpus(plain_demo)
    disk = on_disk.corpus
    assert on_disk.manifest["corpus"]["storage"] == "disk" and disk.store is not None
    assert len(disk) == len(memory) == 2001 and disk.sha256 == memory.sha256
    for i in (0, 1, 1000, 1999, 2000, -1):
        assert disk.passage(i) == memory.passage(i)
    assert disk.ids[-1] == "9" and disk.titles[-1] == "Wiki 18" and disk.texts[2000] == "A row in the wiki-18 layout."
    assert list(disk.ids[:3]) == memory.ids[:3]
    for pid in (memory.ids[0], memory.ids[1500], "9"):
        assert disk.row(pid) == memory.row(pid)
    assert disk.row("no such id") is None and disk.get("no such id") is None
    with pytest.raises(IndexError):
        disk.passage(2001)
    # The same top-k as an index over the corpus in memory; the corpus itself is not copied.
    reference = BM25Index.build(memory).search(QUERIES, 5)
    got = on_disk.search(QUERIES, 5)
    assert [[(h.id, h.title, h.text) for h in hits] for hits in got] == \
        [[(h.id, h.title, h.text) for h in hits] for hits in reference]
    assert not list(out.glob("*.jsonl*"))
    table = sum(p.stat().st_size for p in (out / "passages").iterdir())
    assert table < plain_demo.stat().st_size / 20   # ~25 bytes a passage, not the text


def test_index_moved_with_its_corpus_still_finds_it_and_a_lost_corpus_is_named(plain_demo, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    shutil.copy(plain_demo, home / "corpus.jsonl")
    build_index(home / "corpus.jsonl", home / "idx", progress=False)
    moved = tmp_path / "moved"
    shutil.move(home, moved)
    index = load_index(moved / "idx")   # by the path relative to the index
    assert index.corpus.path == str(moved / "corpus.jsonl") and len(index) == 2001
    (moved / "corpus.jsonl").rename(moved / "elsewhere.jsonl")
    with pytest.raises(RagrlError, match=r"searches the corpus .*corpus.jsonl .* which is not there"):
        load_index(moved / "idx")
    assert len(load_index(moved / "idx", corpus=moved / "elsewhere.jsonl")) == 2001


def test_a_changed_corpus_is_refused(plain_demo, tmp_path, monkeypatch):
    path = tmp_path / "c.jsonl"
    shutil.copy(plain_demo, path)
    out = build_index(path, tmp_path / "idx", progress=False)
    raw = bytearray(path.read_bytes())
    at = raw.index(b'"text": "') + 9
    raw[at] = ord("Z") if raw[at] != ord("Z") else ord("Y")     # one byte, same size
    path.write_bytes(bytes(raw))
    with pytest.raises(IndexMismatchError, match="has sha256"):
        load_index(out)
    # A large corpus is not rehashed on every load: its size and 64 sampled blocks are, and the whole
    # file only when its modification time moved. Here, as if the file were large:
    monkeypatch.setattr("ragrl.retrieval.passage_file.FULL_HASH_MAX_BYTES", 0)
    monkeypatch.setattr("ragrl.retrieval.passage_file.SAMPLE_BLOCKS", 2)   # the first and last 64 KiB
    recorded = fingerprint(path)
    check_unchanged(path, recorded, what="index x")               # the same file passes
    os.utime(path, ns=(recorded["mtime_ns"] + 10**9, recorded["mtime_ns"] + 10**9))
    check_unchanged(path, recorded, what="index x")               # touched, same bytes: rehashed, passes
    with open(path, "ab") as f:
        f.write(b"\n")
    with pytest.raises(IndexMismatchError, match="another file now"):
        check_unchanged(path, recorded, what="index x")
    raw = bytearray(path.read_bytes()[:-1])
    raw[len(raw) // 2] ^= 1     # one flipped bit away from the sampled blocks, and mtime moved
    path.write_bytes(bytes(raw))
    with pytest.raises(IndexMismatchError, match="modified since"):
        check_unchanged(path, recorded, what="index x")


def test_passage_table_checks_every_row(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "title": "t", "text": "x"}\n\n{"id": "b", "title": "t"}\n')
    with pytest.raises(CorpusError, match=r'bad.jsonl:3: missing field "text"'):
        write_passage_table(bad, tmp_path / "t1", passage_fields)
    dup = tmp_path / "dup.jsonl"
    dup.write_text("".join(json.dumps({"id": i, "title": "", "text": "x"}) + "\n" for i in ["a", "b", "c", "b"]))
    with pytest.raises(CorpusError, match=r'dup.jsonl:4: duplicate id "b" \(first seen on line 2\)'):
        write_passage_table(dup, tmp_path / "t2", passage_fields)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    with pytest.raises(CorpusError, match="corpus is empty"):
        write_passage_table(empty, tmp_path / "t3", passage_fields)
    with pytest.raises(CorpusError, match="gunzip it first"):
        write_passage_table(DEMO_CORPUS, tmp_path / "t4", passage_fields)
    # A failed build leaves no index (and no out folder) behind.
    with pytest.raises(CorpusError):
        build_index(bad, tmp_path / "idx", progress=False)
    assert not (tmp_path / "idx").exists() and not list(tmp_path.glob(".idx.tmp-*"))
