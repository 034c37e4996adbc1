"""Dense builds that stream and resume, and the compressed IVF kinds with their measured recall,
with the real MiniLM, faiss and the kit's precomputed vectors."""
import json

import faiss
import numpy as np
import pytest

from ragrl.errors import RagrlError
from ragrl.paths import DEMO_CORPUS, resolve_kit
from ragrl.retrieval.corpus import Corpus, load_corpus, write_corpus
from ragrl.retrieval.dense import DenseIndex
from ragrl.retrieval.dense_build import default_nlist, exact_top_k, recall_at_k, rerank_exact
from ragrl.retrieval.index import build_index, load_index

QUERIES = ["American singer album", "river in Europe", "football club", "1990s television series"]


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    demo = load_corpus(DEMO_CORPUS)
    path = tmp_path_factory.mktemp("c") / "small.jsonl"
    write_corpus(Corpus(ids=demo.ids[:40], titles=demo.titles[:40], texts=demo.texts[:40], sha256=""), path)
    return path


def _ids(results):
    return [[h.id for h in hits] for hits in results]


def _kit_slice(tmp_path, n: int):
    """The kit's first n passages and their precomputed MiniLM vectors (no encoding), as files."""
    corpus = load_corpus(resolve_kit("kit:corpus/wiki_passages.jsonl.gz"))
    vectors = np.load(resolve_kit("kit:embeddings/wiki_passages.all-minilm-l6-v2.fp16.npy"), mmap_mode="r")
    path, vec_path = tmp_path / "c.jsonl", tmp_path / "v.npy"
    write_corpus(Corpus(ids=corpus.ids[:n], titles=corpus.titles[:n], texts=corpus.texts[:n], sha256=""), path)
    np.save(vec_path, np.asarray(vectors[:n]))
    return path, vec_path


def test_a_killed_encoding_resumes_after_its_last_chunk_and_equals_one_pass(small, minilm, tmp_path, monkeypatch):
    monkeypatch.setattr("ragrl.retrieval.dense_build.ENCODE_CHUNK_ROWS", 16)   # 40 passages: chunks of 16, 16, 8
    calls = []

    class CrashOnce:
        """The real MiniLM; the first build dies in its second chunk (its third batch of 8)."""

        def __getattr__(self, name):
            return getattr(minilm, name)

        def encode(self, texts, **kwargs):
            calls.append(len(texts))
            if len(calls) == 3 and not crashed:
                crashed.append(1)
                raise KeyboardInterrupt("killed while encoding")
            return minilm.encode(texts, **kwargs)

    crashed = []
    monkeypatch.setattr("ragrl.retrieval.dense.load_embedder", lambda name, device=None: CrashOnce())
    with pytest.raises(KeyboardInterrupt):
        build_index(small, tmp_path / "idx", kind="dense", batch_size=8, progress=False)
    state = json.loads((tmp_path / ".idx.build" / "dense" / "encoded.json").read_text())
    assert state["rows_done"] == 16 and not (tmp_path / "idx").exists()
    calls.clear()
    index = load_index(build_index(small, tmp_path / "idx", kind="dense", batch_size=8, progress=False))
    assert sum(calls) == 40 - 16            # only the passages not yet on disk were encoded again
    reference = DenseIndex.build(load_corpus(small), "all-minilm-l6-v2", batch_size=8)
    np.testing.assert_allclose(index.backend.embeddings, reference.embeddings, atol=1e-6)
    assert _ids(index.search(QUERIES, 5)) == _ids(reference.search(QUERIES, 5))
    assert not (tmp_path / ".idx.build").exists()


def test_exact_top_k_and_recall_by_hand():
    vectors = np.eye(4, dtype=np.float32)[[0, 1, 2, 3, 0]] * np.array([[1], [1], [1], [1], [0.5]], dtype=np.float32)
    assert exact_top_k(vectors, vectors[:1], 2, chunk_rows=2).tolist() == [[0, 4]]

    class Fixed:   # an "approximate index" that always answers rows 0, 1
        def search(self, q, k, params=None):
            return None, np.array([[0, 1, 2][:k]] * len(q))

    # Queries are rows 0..4 (all): each query's own row is left out of both lists. Exact top-1 of
    # row 0 is row 4, of row 4 is row 0; of rows 1-3, a zero-score tie broken by the lowest other row.
    got = recall_at_k(Fixed(), vectors, k=1, queries=5)
    # row 0: exact [4], approx {1} -> 0; row 1: exact [0], approx {0} -> 1; row 2: exact [0] -> 1;
    # row 3: exact [0] -> 1; row 4: exact [0], approx {0, 1} minus own -> 1. Mean 4/5.
    assert got["recall"] == pytest.approx(0.8) and got["queries"] == 5


def test_rerank_exact_by_hand():
    """Candidates re-scored from the vectors: the best k by exact score, ties to the lower row, -1 left out
    and padded."""
    vectors = np.array([[1, 0], [0, 1], [0.6, 0.8], [0.8, 0.6]], dtype=np.float32)
    query = np.array([[1, 0], [0, 1]], dtype=np.float32)
    # query 0 scores rows 1, 2, 3, 0 as 0, 0.6, 0.8, 1; query 1 has one candidate, row 1 (score 1)
    scores, rows = rerank_exact(np.array([[1, 2, 3, 0], [-1, 1, -1, -1]]), vectors, query, 3)
    assert rows.tolist() == [[0, 3, 2], [1, -1, -1]]
    assert scores[0].tolist() == pytest.approx([1.0, 0.8, 0.6]) and scores[1, 0] == pytest.approx(1.0)
    assert np.isneginf(scores[1, 1:]).all()
    tied = np.array([[0.5, 0.5], [0.5, 0.5]], dtype=np.float32)
    assert rerank_exact(np.array([[1, 0]]), tied, query[:1], 2)[1].tolist() == [[0, 1]]


def test_exact_top_k_in_small_chunks_equals_one_full_sort_ties_to_the_lower_row():
    """Chunks bounded by `max_scores` keep only their own top k; the merge must still equal a stable
    sort of all scores, including rows tied at the k-th score across chunk edges."""
    rng = np.random.default_rng(0)
    vectors = np.round(rng.standard_normal((3000, 8)), 0).astype(np.float32)    # many exact ties
    queries = np.round(rng.standard_normal((13, 8)), 0).astype(np.float32)
    want = np.argsort(-(queries @ vectors.T), axis=1, kind="stable")[:, :11]
    for rows in (5, 64, 1000, 3000):
        got = exact_top_k(vectors, queries, 11, chunk_rows=rows, max_scores=13 * rows)
        assert got.tolist() == want.tolist(), rows
    assert exact_top_k(vectors, queries, 11, max_scores=1).tolist() == want.tolist()   # k rows a chunk at least


def test_compressed_kinds_record_their_recall_and_load_memory_mapped(tmp_path):
    """5,000 kit passages with the kit's precomputed MiniLM vectors (no encoding)."""
    n = 5000
    path, vec_path = _kit_slice(tmp_path, n)
    flat = load_index(build_index(path, tmp_path / "flat", kind="dense", vectors=vec_path, progress=False))
    sizes, recalls = {}, {}
    # ivf_pq re-ranks 10 candidates a hit from the memory-mapped vectors by default; its codes alone
    # (rerank 0) miss a third of the exact top 10 here, two thirds at 2M passages (benchmarks)
    for name, kind, rerank, floor in (("ivf_sq8", "ivf_sq8", None, 0.9), ("pq_codes", "ivf_pq", 0, 0.3),
                                      ("ivf_pq", "ivf_pq", None, 0.9)):
        out = build_index(path, tmp_path / name, kind="dense", vectors=vec_path, dense_index=kind, rerank=rerank,
                          recall_queries=200, progress=False)
        params = json.loads((out / "manifest.json").read_text())["params"]
        assert params["index"] == kind and params["nlist"] == default_nlist(n) == 125   # 4 sqrt(n), 40 points a list
        assert params["rerank"] == {"ivf_sq8": 0, "pq_codes": 0, "ivf_pq": 10}[name]
        assert params["recall_at_10"]["queries"] == 200 and params["recall_at_10"]["recall"] >= floor
        recalls[name] = params["recall_at_10"]["recall"]
        index = load_index(out)
        assert isinstance(index.backend.embeddings, np.memmap)      # vectors stay on disk
        assert index.backend.nprobe == params["nprobe"] == 32 and index.backend.rerank == params["rerank"]
        hits = index.search(QUERIES, 10)
        exact = flat.search(QUERIES, 10)
        overlap = np.mean([len(set(_ids([a])[0]) & set(_ids([b])[0])) / 10 for a, b in zip(hits, exact)])
        assert overlap >= floor - 0.2
        if params["rerank"]:   # re-scored exactly: each hit's score is its cosine, as flat search gives it
            for got, want in zip(hits, flat.search(QUERIES, 50)):
                cosine = {h.id: h.score for h in want}
                assert all(abs(h.score - cosine[h.id]) < 1e-5 for h in got if h.id in cosine)
                assert [h.score for h in got] == sorted((h.score for h in got), reverse=True)
        sizes[name] = faiss.extract_index_ivf(index.backend.index).code_size
    assert sizes == {"ivf_sq8": 384, "pq_codes": 48, "ivf_pq": 48}      # bytes a vector, against 1,536 as float32
    assert recalls["ivf_pq"] > recalls["pq_codes"] + 0.2      # 0.97 against 0.70 here
    with pytest.raises(RagrlError, match="--rerank is for the IVF kinds"):
        build_index(path, tmp_path / "x", kind="dense", vectors=vec_path, dense_index="flat", rerank=5)
    with pytest.raises(RagrlError, match="rerank must be 0"):
        build_index(path, tmp_path / "x", kind="dense", vectors=vec_path, dense_index="ivf_pq", rerank=-1)
    with pytest.raises(RagrlError, match="unknown dense index 'ivf_foo'"):
        build_index(path, tmp_path / "x", kind="dense", vectors=vec_path, dense_index="ivf_foo")
    with pytest.raises(RagrlError, match="pq_m must divide"):
        build_index(path, tmp_path / "x", kind="dense", vectors=vec_path, dense_index="ivf_pq", pq_m=7)
    with pytest.raises(RagrlError, match="a bm25 index has no vectors"):
        build_index(path, tmp_path / "x", kind="bm25", dense_index="ivf_sq8")
    with pytest.raises(RagrlError, match="a bm25 index has no vectors"):
        build_index(path, tmp_path / "x", kind="bm25", rerank=10)


def test_harr_pools_come_from_the_ivf_search_the_index_was_built_for(tmp_path):
    """HARR's sampler asks the dense index for candidate pools and deterministic hops; over an IVF
    index they must use its nprobe and re-ranking as `search` does (it used to call faiss bare:
    one cell visited, PQ's approximate scores)."""
    from ragrl.models.query_encoder import QueryEncoder
    from ragrl.retrieval.stochastic import QueryRequest, StochasticRetriever

    n = 5000
    path, vec_path = _kit_slice(tmp_path, n)
    dense = load_index(build_index(path, tmp_path / "pq", kind="dense", vectors=vec_path, dense_index="ivf_pq",
                                   progress=False)).backend
    assert dense.nprobe == 32 and dense.rerank == 10
    sampler = StochasticRetriever(dense, QueryEncoder("all-minilm-l6-v2"), pool=10, temperature=0.05)
    assert _ids(sampler.search_hops(QUERIES, 5, hops=1)) == _ids(dense.search(QUERIES, 5))
    drawn = sampler.sample([QueryRequest(q, q) for q in QUERIES], 3)
    for query, (_, action) in zip(QUERIES, drawn):
        assert action.candidate_ids == [h.id for h in dense.search([query], 10)[0]]
