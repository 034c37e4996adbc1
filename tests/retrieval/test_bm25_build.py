"""BM25 written a chunk of passages at a time: the same top-k as bm25s's in-memory build, and a
build killed partway resumes after its last finished chunk."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from ragrl.paths import DEMO_CORPUS
from ragrl.retrieval.bm25 import BM25Index
from ragrl.retrieval.corpus import Corpus, load_corpus, write_corpus
from ragrl.retrieval.index import build_index, load_index

QUERIES = ["American singer album", "river in Europe", "football club manager", "the of and",
           "1990s television series", "Zorbleflax", "battle war army general", "film directed by"]


def _hits(results):
    return [[(h.id, round(h.score, 4)) for h in hits] for hits in results]


def test_chunked_build_equals_in_memory_build(tmp_path):
    demo = load_corpus(DEMO_CORPUS)
    n = 300
    # Some passages with no indexable word at all (stopwords only), as real corpora have.
    texts = [t if i % 50 else "the of and" for i, t in enumerate(demo.texts[:n])]
    corpus = Corpus(ids=demo.ids[:n], titles=["" if i % 50 == 0 else t for i, t in enumerate(demo.titles[:n])],
                    texts=texts, sha256="x")
    reference = BM25Index.build(corpus, k1=0.9, b=0.4)
    BM25Index.write(corpus, tmp_path / "bm25", tmp_path / "work", k1=0.9, b=0.4, chunk_rows=37)
    chunked = BM25Index.load(tmp_path / "bm25", corpus)
    assert len(list((tmp_path / "work").glob("chunk_*.npz"))) == 9    # 300 passages in chunks of 37
    assert _hits(chunked.search(QUERIES, 10)) == _hits(reference.search(QUERIES, 10))
    some = chunked.search(QUERIES, 10)
    assert all(len(h) == 10 for h in some[:3]) and some[3] == []
    got, ref = chunked.retriever.scores, reference.retriever.scores
    assert len(got["data"]) == len(ref["data"]) and got["num_docs"] == ref["num_docs"] == n
    assert set(chunked.retriever.vocab_dict) == set(reference.retriever.vocab_dict)   # "" included


def test_index_build_through_the_cli_path_matches_the_reference(tmp_path):
    path = tmp_path / "c.jsonl"
    demo = load_corpus(DEMO_CORPUS)
    write_corpus(Corpus(ids=demo.ids[:1000], titles=demo.titles[:1000], texts=demo.texts[:1000], sha256=""), path)
    index = load_index(build_index(path, tmp_path / "idx", progress=False))
    reference = BM25Index.build(load_corpus(path))
    assert _hits(index.search(QUERIES, 5)) == _hits(reference.search(QUERIES, 5))
    assert not (tmp_path / ".idx.build").exists()     # the work folder goes once the index is in place


_BUILDER = """
import sys
import ragrl.retrieval.bm25_build as b
b.CHUNK_ROWS = 400
from ragrl.retrieval.index import build_index
build_index(sys.argv[1], sys.argv[2], progress=False)
"""


def test_a_killed_build_resumes_after_its_last_finished_chunk(tmp_path, monkeypatch):
    corpus = tmp_path / "demo.jsonl"
    write_corpus(load_corpus(DEMO_CORPUS), corpus)       # 8,336 passages: 21 chunks of 400
    out, work = tmp_path / "idx", tmp_path / ".idx.build" / "bm25"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen([sys.executable, "-c", _BUILDER, str(corpus), str(out)], env=env)
    deadline = time.monotonic() + 300
    while len(list(work.glob("chunk_*.npz"))) < 3 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done = sorted(p.name for p in work.glob("chunk_*.npz"))
    assert 3 <= len(done) < 21 and not out.exists()
    assert json.loads((work / "build.json").read_text())["chunk_rows"] == 400

    written = []
    real = __import__("ragrl.retrieval.bm25_build", fromlist=["_write_chunk"])._write_chunk
    monkeypatch.setattr("ragrl.retrieval.bm25_build._write_chunk",
                        lambda c, s, e, t, path: (written.append(path.name), real(c, s, e, t, path)))
    monkeypatch.setattr("ragrl.retrieval.bm25_build.CHUNK_ROWS", 400)
    index = load_index(build_index(corpus, out, progress=False))
    assert len(written) == 21 - len(done) and not set(written) & set(done)   # only the missing chunks
    reference = BM25Index.build(load_corpus(corpus))
    assert _hits(index.search(QUERIES, 5)) == _hits(reference.search(QUERIES, 5))
    assert not work.exists()


def test_chunks_of_another_corpus_or_setting_are_not_reused(tmp_path):
    demo = load_corpus(DEMO_CORPUS)
    a = Corpus(ids=demo.ids[:100], titles=demo.titles[:100], texts=demo.texts[:100], sha256="a")
    b = Corpus(ids=demo.ids[100:200], titles=demo.titles[100:200], texts=demo.texts[100:200], sha256="b")
    BM25Index.write(a, tmp_path / "a", tmp_path / "work", chunk_rows=30)
    BM25Index.write(b, tmp_path / "b", tmp_path / "work", chunk_rows=30)   # same work folder, other corpus
    q = ["American singer album", "river"]
    assert _hits(BM25Index.load(tmp_path / "b", b).search(q, 5)) == _hits(BM25Index.build(b).search(q, 5))
    with pytest.raises(Exception):
        BM25Index.load(tmp_path / "b", a if len(a) != len(b) else Corpus(ids=["x"], titles=[""], texts=["y"], sha256=""))
