"""Dense index builds that stream, and faiss indexes that fit.

Passage vectors are encoded a chunk at a time into a memory-mapped .npy on disk (a killed build
resumes after its last finished chunk), and the faiss index is filled from that file a chunk at a
time. Beside exact flat search and HNSW (both hold float32 vectors in memory: 32 GB for wiki-18 at
384-d), two compressed approximate kinds, trained on a seeded sample and memory-mapped when loaded:

    ivf_sq8   inverted lists of 8-bit scalar-quantised vectors (4x smaller than float32)
    ivf_pq    inverted lists of product-quantised codes (pq_m bytes a vector: 32x smaller at 48)

An IVF kind may re-rank: it asks its codes for `rerank` × k candidates and scores them exactly from
the memory-mapped vectors file (`rerank_exact`), so product codes (whose own recall@10 is low) find
what exact search finds while memory holds only codes; the reads are a few hundred rows a query.
`recall_at_k` measures what the compression costs: the approximate top-k against exact search
over the same vectors, for a sample of passage vectors used as queries (each query's own passage
left out of both lists). The build records it in the manifest.
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np

from ragrl.errors import RagrlError
from ragrl.paths import atomic_write_text
from ragrl.retrieval.corpus import Corpus

FAISS_KINDS = ("flat", "hnsw", "ivf_sq8", "ivf_pq")
ENCODE_CHUNK_ROWS = 4096
ADD_CHUNK_ROWS = 65536
HNSW_NEIGHBOURS = 32  # graph degree M: the usual recall/memory balance for 384-d vectors
HNSW_EF_CONSTRUCTION = 80
TRAIN_POINTS_PER_LIST = 40   # faiss's k-means wants ~39 points a centroid or warns
DEFAULT_RERANK = {"ivf_pq": 10}   # 48-byte codes alone: recall@10 0.32 at 2M passages (benchmarks)


def default_nlist(rows: int) -> int:
    """Inverted lists for `rows` vectors: ~4 sqrt(rows), a power of two, with enough training points."""
    return int(max(1, min(2 ** round(math.log2(4 * math.sqrt(rows))), rows // TRAIN_POINTS_PER_LIST)))


def default_nprobe(nlist: int) -> int:
    """Lists visited per query: 1/32 of them, at least 32 (recall@10 against the cost, see benchmarks)."""
    return min(nlist, max(32, nlist // 32))


def encode_to_file(corpus: Corpus, embed, dim: int, out_path: Path, work_dir: Path, *, identity: dict,
                   chunk_rows: int = ENCODE_CHUNK_ROWS, progress=None) -> np.ndarray:
    """Vectors [rows, dim] float32 of every passage (`embed(texts) -> [n, dim]`), written to `out_path`
    a chunk at a time through `work_dir` (resumed there if a build of the same `identity` was killed).
    Returns them memory-mapped."""
    work_dir.mkdir(parents=True, exist_ok=True)
    state_path, vectors_path = work_dir / "encoded.json", work_dir / "vectors.npy"
    n = len(corpus)
    try:
        state = json.loads(state_path.read_text())
    except (OSError, ValueError):
        state = {}
    if state.get("identity") == identity and vectors_path.is_file():
        vectors = np.load(vectors_path, mmap_mode="r+")
        done = int(state["rows_done"])
    else:
        vectors = np.lib.format.open_memmap(vectors_path, mode="w+", dtype=np.float32, shape=(n, dim))
        done = 0
    for start in range(done, n, chunk_rows):
        end = min(start + chunk_rows, n)
        vectors[start:end] = embed([_text(corpus.passage(i)) for i in range(start, end)])
        vectors.flush()   # the rows are on disk before the state says so
        atomic_write_text(state_path, json.dumps({"identity": identity, "rows_done": end}))
        if progress:
            progress("encode", end, n)
    del vectors
    os.replace(vectors_path, out_path)
    state_path.unlink(missing_ok=True)
    return np.load(out_path, mmap_mode="r")


def _text(p: dict) -> str:
    # As dense.passage_text: "Title. text" (the model has no title segment).
    return f"{p['title']}. {p['text']}" if p["title"] else p["text"]


def copy_vectors(source: np.ndarray, out_path: Path, *, chunk_rows: int = ADD_CHUNK_ROWS) -> np.ndarray:
    """Precomputed vectors (possibly memory-mapped) as unit float32 rows in `out_path`, a chunk at a time."""
    out = np.lib.format.open_memmap(out_path, mode="w+", dtype=np.float32, shape=source.shape)
    for start in range(0, len(source), chunk_rows):
        out[start:start + chunk_rows] = np.asarray(source[start:start + chunk_rows], dtype=np.float32)
    out.flush()
    del out
    return np.load(out_path, mmap_mode="r")


def check_rerank(kind: str, rerank: int | None) -> None:
    """Refuse a re-ranking count the `kind` of dense index cannot use (before any passage is encoded)."""
    if rerank is not None and rerank < 0:
        raise RagrlError(f"rerank must be 0 (off) or a positive number of candidates per hit, got {rerank}")
    if rerank and not kind.startswith("ivf"):
        raise RagrlError(f"--rerank is for the IVF kinds (--dense ivf_sq8 or ivf_pq); {kind} search is "
                         f"{'exact' if kind == 'flat' else 'over the whole vectors'} already")


def make_faiss_index(faiss, vectors: np.ndarray, kind: str, *, nlist: int | None = None, pq_m: int | None = None,
                     rerank: int | None = None, seed: int = 0, progress=None):
    """A faiss inner-product index of `kind` over `vectors` (added a chunk at a time) and the
    parameters it was made with. `rerank` (IVF kinds; None: DEFAULT_RERANK, 0: off) is recorded for search."""
    if kind not in FAISS_KINDS:
        raise RagrlError(f"unknown dense index {kind!r}; choose one of {', '.join(FAISS_KINDS)}")
    check_rerank(kind, rerank)
    n, dim = vectors.shape
    params: dict = {"index": kind}
    if kind == "flat":
        index = faiss.IndexFlatIP(dim)
    elif kind == "hnsw":
        index = faiss.IndexHNSWFlat(dim, HNSW_NEIGHBOURS, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = HNSW_EF_CONSTRUCTION
    else:
        nlist = int(nlist or default_nlist(n))
        if not 1 <= nlist <= n:
            raise RagrlError(f"nlist must be between 1 and the corpus's {n} rows, got {nlist}")
        quantizer = faiss.IndexFlatIP(dim)
        if kind == "ivf_sq8":
            index = faiss.IndexIVFScalarQuantizer(quantizer, dim, nlist, faiss.ScalarQuantizer.QT_8bit,
                                                  faiss.METRIC_INNER_PRODUCT)
        else:
            pq_m = int(pq_m or dim // 8)
            if dim % pq_m:
                raise RagrlError(f"pq_m must divide the vectors' dimension {dim}, got {pq_m}")
            index = faiss.IndexIVFPQ(quantizer, dim, nlist, pq_m, 8, faiss.METRIC_INNER_PRODUCT)
            params["pq_m"] = pq_m
        train_rows = min(n, max(TRAIN_POINTS_PER_LIST * max(nlist, 256 if kind == "ivf_pq" else 1), 10_000))
        sample = np.sort(np.random.default_rng(seed).choice(n, train_rows, replace=False))
        index.train(np.ascontiguousarray(vectors[sample], dtype=np.float32))
        params.update(nlist=nlist, nprobe=default_nprobe(nlist), train_rows=int(train_rows), seed=seed,
                      rerank=int(DEFAULT_RERANK.get(kind, 0) if rerank is None else rerank))
    for start in range(0, n, ADD_CHUNK_ROWS):
        index.add(np.ascontiguousarray(vectors[start:start + ADD_CHUNK_ROWS], dtype=np.float32))
        if progress:
            progress(f"add to {kind}", min(start + ADD_CHUNK_ROWS, n), n)
    return index, params


def exact_top_k(vectors: np.ndarray, queries: np.ndarray, k: int, *, chunk_rows: int = ADD_CHUNK_ROWS,
                max_scores: int = 1 << 24) -> np.ndarray:
    """Rows [len(queries), k] of the exact top-k by inner product, ties to the lower row, over `vectors`
    a chunk at a time. A chunk holds at most `max_scores` query-row scores (64 MB of float32), and each
    keeps only its own top k, so a recall measurement adds tens of MB to a build, not a copy of the
    vectors' size (1,000 queries against 65,536-row chunks with full sorts took 1.5 GB)."""
    rows = max(k, min(chunk_rows, max_scores // max(len(queries), 1)))
    best_s = np.full((len(queries), k), -np.inf, dtype=np.float32)
    best_r = np.full((len(queries), k), -1, dtype=np.int64)
    for start in range(0, len(vectors), rows):
        scores = queries @ np.asarray(vectors[start:start + rows], dtype=np.float32).T
        kk = min(k, scores.shape[1])
        kth = -np.partition(-scores, kk - 1, axis=1)[:, kk - 1:kk]
        # the scores above the k-th, then those equal to it in row order: a stable sort of a 3-valued key
        tier = np.where(scores > kth, 0, np.where(scores == kth, 1, 2)).astype(np.int8)
        own = np.argsort(tier, axis=1, kind="stable")[:, :kk]
        s = np.concatenate([best_s, np.take_along_axis(scores, own, 1)], axis=1)
        r = np.concatenate([best_r, own + start], axis=1)
        top = np.lexsort((r, -s), axis=1)[:, :k]
        best_s, best_r = np.take_along_axis(s, top, 1), np.take_along_axis(r, top, 1)
    return best_r


def rerank_exact(rows: np.ndarray, vectors: np.ndarray, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Candidates `rows` [q, c] (−1: none) re-scored exactly against `vectors` (read once per distinct
    row, in row order, from a memory map): (scores, rows) [q, k] of the best k, ties to the lower row,
    padded with −inf / −1.

    >>> v = np.eye(3, dtype=np.float32)
    >>> rerank_exact(np.array([[2, 0, -1]]), v, np.array([[0.5, 0.0, 0.9]], dtype=np.float32), 2)[1].tolist()
    [[2, 0]]
    """
    valid = rows >= 0
    distinct, where = np.unique(rows[valid], return_inverse=True)
    gathered = np.asarray(vectors[distinct], dtype=np.float32)           # [u, dim]
    scores = np.full(rows.shape, -np.inf, dtype=np.float32)
    scores[valid] = np.einsum("ij,ij->i", gathered[where], np.repeat(queries, valid.sum(1), axis=0))
    order = np.lexsort((np.where(valid, rows, np.iinfo(np.int64).max), -scores), axis=1)[:, :k]
    best_s, best_r = np.take_along_axis(scores, order, 1), np.take_along_axis(rows, order, 1)
    best_r = np.where(np.isfinite(best_s), best_r, -1)
    if best_s.shape[1] < k:
        pad = k - best_s.shape[1]
        best_s = np.pad(best_s, ((0, 0), (0, pad)), constant_values=-np.inf)
        best_r = np.pad(best_r, ((0, 0), (0, pad)), constant_values=-1)
    return best_s, best_r


def recall_at_k(index, vectors: np.ndarray, *, k: int = 10, queries: int = 1000, seed: int = 0,
                search_params=None, rerank: int = 0) -> dict:
    """recall@k of `index` (re-ranked from `vectors` when `rerank` > 0, as it searches) against exact
    search over `vectors`: passage vectors as queries (a seeded sample), each query's own passage left
    out of both lists."""
    n = len(vectors)
    rows = np.sort(np.random.default_rng(seed).choice(n, min(queries, n), replace=False))
    q = np.ascontiguousarray(vectors[rows], dtype=np.float32)
    exact = exact_top_k(vectors, q, k + 1)
    _, approx = index.search(q, (k + 1) * max(rerank, 1), params=search_params)
    if rerank:
        approx = rerank_exact(approx, vectors, q, k + 1)[1]
    hits = []
    for own, e, a in zip(rows, exact, approx):
        e_set = [r for r in e if r != own][:k]
        a_set = {r for r in a if r != own and r >= 0}
        hits.append(len(a_set.intersection(e_set)) / max(len(e_set), 1))
    out = {"k": k, "recall": float(np.mean(hits)), "queries": int(len(rows)), "seed": seed}
    return {**out, "rerank": rerank} if rerank else out


