"""Dense retrieval: a sentence-transformers encoder and a faiss inner-product index.

Embeddings are L2-normalised, so inner product = cosine similarity. Flat search is exact and
fast enough for ~10^5 passages on CPU; HNSW trades a little recall for sub-linear search on
larger corpora.

A passage is encoded as "{title}. {text}": MiniLM has no separate title segment (unlike DPR's
[SEP] pair), and a plain sentence keeps the input like its training text while putting the
page's entity name, which multi-hop questions usually mention, first, before any truncation
at the model's 256-token limit.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from rich.progress import track

from ragrl.errors import IndexMismatchError, RagrlError
from ragrl.models.embedder import load_embedder
from ragrl.retrieval.base import Hit
from ragrl.retrieval.corpus import Corpus
from ragrl.retrieval import dense_build
from ragrl.retrieval.dense_build import copy_vectors, encode_to_file, make_faiss_index, recall_at_k, rerank_exact

if TYPE_CHECKING:
    import faiss


def faiss_module():
    """faiss, imported when a dense index is built or read, not with ragrl.retrieval: a BM25-only run
    never needs it, and a lent GPU machine lacks the wheel (18 MiB of a call's 64 MiB carry)."""
    import faiss  # late: only dense indexes need it (see the docstring)
    return faiss


EMBEDDINGS_FILE = "embeddings.npy"
INDEX_FILES = {"hnsw": "hnsw.faiss", "ivf_sq8": "ivf.faiss", "ivf_pq": "ivf.faiss"}   # flat: rebuilt from the vectors


def passage_text(title: str, text: str) -> str:
    return f"{title}. {text}" if title else text


def encode(model, texts: list[str], batch_size: int = 64, progress: bool = False, what: str = "passages") -> np.ndarray:
    """Normalised float32 embeddings [len(texts), dim], encoded batch by batch (with a progress bar)."""
    dim = embedding_dim(model)
    out = np.empty((len(texts), dim), dtype=np.float32)
    starts = range(0, len(texts), batch_size)
    if progress:
        starts = track(starts, description=f"encoding {len(texts)} {what}", total=len(starts))
    for start in starts:
        batch = texts[start : start + batch_size]
        out[start : start + len(batch)] = model.encode(
            batch, batch_size=batch_size, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False
        )
    return out


def embedding_dim(model) -> int:
    # sentence-transformers 6 renamed get_sentence_embedding_dimension; accept both.
    get = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
    return int(get())


def _faiss_index(embeddings: np.ndarray, hnsw: bool) -> faiss.Index:
    return make_faiss_index(faiss_module(), embeddings, "hnsw" if hnsw else "flat")[0]


class DenseIndex:
    """Cosine-similarity search over passage embeddings [rows, dim].

    `embeddings` is None for an index read from a faiss file as it ships (`load_faiss`: Search-R1's
    and FlashRAG's wiki-18 indexes): its vectors stay in the memory-mapped faiss file, so only search
    works, not what needs the vectors themselves (HARR's sampler). `query_prefix` is put before
    every query (e5's "query: ")."""

    def __init__(self, corpus: Corpus, encoder: str, embeddings: np.ndarray | None, index: faiss.Index, *,
                 hnsw: bool, query_prefix: str = "", nprobe: int | None = None, rerank: int = 0):
        self.corpus = corpus
        self.encoder = encoder
        self.embeddings = embeddings  # [rows, dim] float32, unit norm (kept for rerankers/HARR), or None
        self.index = index
        self.hnsw = hnsw
        self.query_prefix = query_prefix
        self.nprobe = nprobe          # cells an IVF index visits per query
        if rerank and embeddings is None:
            raise RagrlError("rerank re-scores candidates from the passage vectors, and this index has none")
        self.rerank = rerank          # candidates per hit re-scored from the vectors (0: off)
        self.model = load_embedder(encoder)

    @property
    def dim(self) -> int:
        return int(self.index.d)

    @classmethod
    def from_vectors(cls, corpus: Corpus, encoder: str, vectors: np.ndarray, *, hnsw: bool = False) -> "DenseIndex":
        """An index over precomputed passage vectors (checked first with `check_vectors`)."""
        embeddings = np.ascontiguousarray(vectors, dtype=np.float32)
        return cls(corpus, encoder, embeddings, _faiss_index(embeddings, hnsw), hnsw=hnsw)

    @classmethod
    def build(
        cls, corpus: Corpus, encoder: str, *, hnsw: bool = False, batch_size: int = 64, progress: bool = False
    ) -> "DenseIndex":
        model = load_embedder(encoder)
        texts = [passage_text(t, x) for t, x in zip(corpus.titles, corpus.texts)]
        embeddings = encode(model, texts, batch_size=batch_size, progress=progress)
        return cls(corpus, encoder, embeddings, _faiss_index(embeddings, hnsw), hnsw=hnsw)

    def __len__(self) -> int:
        return len(self.corpus)

    def encode_queries(self, queries: list[str]) -> np.ndarray:
        """[len(queries), dim] normalised query embeddings, all queries in one encode call."""
        # Small encoder batches: on CPU a 64-query batch costs ~45% more per query than 16 (padding).
        return self.model.encode(
            [self.query_prefix + q for q in queries], batch_size=16, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False
        ).astype(np.float32, copy=False)

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        if not queries:
            return []
        k = min(int(k), len(self.corpus))
        if k <= 0:
            return [[] for _ in queries]
        return self.search_vectors(self.encode_queries(queries), k)

    def nearest_rows(self, query_vectors: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(scores, rows), each [n, k], for query embeddings [n, dim]: the one search every caller
        (top-k hits, HARR's candidate pools) goes through, so an HNSW beam, an IVF index's nprobe and
        its re-ranking apply everywhere. A row is -1 where fewer than k neighbours were found."""
        params = _search_params("hnsw" if self.hnsw else "ivf" if self.nprobe else "flat", self.nprobe, k)
        vectors = np.ascontiguousarray(query_vectors, dtype=np.float32)
        scores, rows = self.index.search(vectors, k * max(self.rerank, 1), params=params)
        if self.rerank:   # IVF codes propose, the memory-mapped vectors decide
            scores, rows = rerank_exact(rows, self.embeddings, vectors, k)
        return scores, rows

    def search_vectors(self, query_vectors: np.ndarray, k: int) -> list[list[Hit]]:
        """Top-k hits for precomputed query embeddings [n, dim]."""
        scores, rows = self.nearest_rows(query_vectors, k)
        # HNSW pads with row -1 when it finds fewer than k neighbours.
        return [
            [self.corpus.hit(int(i), s) for i, s in zip(row_ids, row_scores) if i >= 0]
            for row_ids, row_scores in zip(rows, scores)
        ]

    def save(self, directory: str | Path) -> None:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        np.save(directory / EMBEDDINGS_FILE, self.embeddings)
        if self.hnsw:
            faiss_module().write_index(self.index, str(directory / INDEX_FILES["hnsw"]))

    @classmethod
    def write(cls, corpus: Corpus, directory: str | Path, work_dir: str | Path, encoder: str, *, index: str = "flat",
              batch_size: int = 64, vectors: np.ndarray | None = None, nlist: int | None = None,
              pq_m: int | None = None, rerank: int | None = None, recall_queries: int = 0, progress=None) -> dict:
        """Write a dense index folder a chunk at a time (dense_build): the passage vectors (encoded,
        resumable through `work_dir`, or the precomputed `vectors`, possibly memory-mapped) and the
        faiss `index` kind over them. Returns the parameters to record, with recall@10 against flat
        search when `recall_queries` > 0 and the kind is approximate."""
        directory, work_dir = Path(directory), Path(work_dir)
        directory.mkdir(parents=True, exist_ok=True)
        target = directory / EMBEDDINGS_FILE
        if vectors is not None:
            embeddings = copy_vectors(vectors, target)
        else:
            model = load_embedder(encoder)
            dim = embedding_dim(model)
            identity = {"corpus_sha256": corpus.sha256, "rows": len(corpus), "encoder": encoder, "dim": dim,
                        "batch_size": batch_size}
            embeddings = encode_to_file(
                corpus, lambda texts: encode(model, texts, batch_size=batch_size), dim, target, work_dir,
                identity=identity, chunk_rows=batch_size * max(1, dense_build.ENCODE_CHUNK_ROWS // batch_size),
                progress=progress)
        faiss_index, params = make_faiss_index(faiss_module(), embeddings, index, nlist=nlist, pq_m=pq_m, rerank=rerank,
                                               progress=progress)
        if index != "flat":
            faiss_module().write_index(faiss_index, str(directory / INDEX_FILES[index]))
        if recall_queries > 0 and index != "flat":
            search = _search_params(index, params.get("nprobe"), 11)
            params["recall_at_10"] = recall_at_k(faiss_index, embeddings, queries=recall_queries, search_params=search,
                                                 rerank=params.get("rerank", 0))
        return params

    @classmethod
    def load(cls, directory: str | Path, corpus: Corpus, encoder: str, *, hnsw: bool = False,
             params: dict | None = None) -> "DenseIndex":
        """`params`: the manifest's (its "index" kind and "nprobe"); without, flat or `hnsw`."""
        directory = Path(directory)
        kind = (params or {}).get("index") or ("hnsw" if hnsw else "flat")
        try:
            # Flat and HNSW search need the float32 vectors in memory anyway; IVF kinds leave them on disk.
            embeddings = np.load(directory / EMBEDDINGS_FILE, mmap_mode="r" if kind.startswith("ivf") else None)
            # A flat index is rebuilt from the vectors (a memcpy); a graph or inverted lists are read.
            index = read_faiss(directory / INDEX_FILES[kind]) if kind != "flat" else _faiss_index(embeddings, False)
        except (OSError, ValueError, RuntimeError, RagrlError) as e:
            raise RagrlError(f"{directory}: dense index files are missing or corrupt ({e})") from None
        if embeddings.ndim != 2 or embeddings.shape[0] != len(corpus) or index.ntotal != len(corpus):
            raise RagrlError(
                f"{directory}: dense index has {index.ntotal} vectors of shape {embeddings.shape} "
                f"but its corpus has {len(corpus)} rows"
            )
        dense = cls(corpus, encoder, embeddings, index, hnsw=kind == "hnsw", nprobe=(params or {}).get("nprobe"),
                    rerank=int((params or {}).get("rerank") or 0))
        if embedding_dim(dense.model) != dense.dim:
            raise IndexMismatchError(
                f"{directory}: stored vectors are {dense.dim}-d but encoder {encoder!r} makes "
                f"{embedding_dim(dense.model)}-d ones; rebuild the index"
            )
        return dense

    @classmethod
    def load_faiss(cls, path: str | Path, corpus: Corpus, encoder: str, *, query_prefix: str = "",
                   nprobe: int | None = None) -> "DenseIndex":
        """A faiss index file as Search-R1 and FlashRAG ship theirs (row i = corpus line i), memory-
        mapped where faiss can (flat and IVF codes), checked with `check_faiss_index`."""
        index = read_faiss(path)
        dense = cls(corpus, encoder, None, index, hnsw=is_hnsw(index), query_prefix=query_prefix, nprobe=nprobe)
        check_faiss_index(index, corpus, dense.model, encoder, source=str(path))
        return dense


def _search_params(kind: str, nprobe: int | None, k: int):
    """Per-call search parameters, so concurrent searches don't race: the HNSW beam at least k wide,
    the IVF lists to visit."""
    if kind == "hnsw":
        return faiss_module().SearchParametersHNSW(efSearch=max(64, 2 * k))
    if kind.startswith("ivf") and nprobe:
        return faiss_module().SearchParametersIVF(nprobe=int(nprobe))
    return None


def read_faiss(path: str | Path) -> faiss.Index:
    faiss_ = faiss_module()
    try:
        try:
            return faiss_.read_index(str(path), faiss_.IO_FLAG_MMAP | faiss_.IO_FLAG_READ_ONLY)
        except RuntimeError as e:
            if "not" not in str(e).lower() or not Path(path).is_file():
                raise
            return faiss_.read_index(str(path))   # a kind faiss cannot map: read into memory
    except (RuntimeError, OSError) as e:
        raise RagrlError(f"{path}: cannot read a faiss index ({str(e).strip().splitlines()[0]})") from None


def is_hnsw(index) -> bool:
    """Whether a faiss index (any wrapper around it) is an HNSW graph: it is searched with efSearch."""
    return isinstance(faiss_module().downcast_index(index), faiss_module().IndexHNSW)


def check_faiss_index(index, corpus: Corpus, model, encoder: str, *, source: str) -> None:
    """Refuse a faiss index this encoder cannot search: another row count, dimension or metric."""
    faiss_ = faiss_module()
    if index.ntotal != len(corpus):
        raise IndexMismatchError(f"{source}: {index.ntotal} vectors for a corpus of {len(corpus)} passages "
                                 f"({corpus.path}); they must be one per corpus line, in file order")
    dim = embedding_dim(model)
    if index.d != dim:
        raise IndexMismatchError(f"{source}: vectors are {index.d}-d but encoder {encoder!r} makes {dim}-d ones")
    if index.metric_type != faiss_.METRIC_INNER_PRODUCT:
        metric = {faiss_.METRIC_L2: "L2 distance"}.get(index.metric_type, f"metric {index.metric_type}")
        raise IndexMismatchError(f"{source}: the index ranks by {metric}, but ragrl scores unit vectors by inner "
                                 "product (cosine); use an index built with METRIC_INNER_PRODUCT, as Search-R1's "
                                 "and FlashRAG's e5 indexes are")


# Rows re-encoded to check precomputed vectors: first, middle, last and a few fixed others.
SPOT_CHECK_ROWS = 8
SPOT_CHECK_MIN_COSINE = 0.99


def load_vectors(path: str | Path) -> np.ndarray:
    """A [rows, dim] float array from a .npy file (memory-mapped: 21M vectors need not fit), with a
    clear error for anything else."""
    try:
        vectors = np.load(Path(path), mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError) as e:
        raise RagrlError(f"{path}: cannot read passage vectors ({e})") from None
    if vectors.ndim != 2 or vectors.dtype.kind != "f":
        raise RagrlError(f"{path}: passage vectors must be a 2-d float array, got {vectors.dtype} {vectors.shape}")
    for start in range(0, len(vectors), 1 << 16):
        if not np.isfinite(vectors[start:start + (1 << 16)]).all():
            raise RagrlError(f"{path}: passage vectors contain NaN or infinite values")
    return vectors


def check_vectors(vectors: np.ndarray, corpus: Corpus, encoder: str, *, source: str = "vectors") -> None:
    """Refuse vectors that do not belong to this corpus and encoder, before any index is written.

    Row count and dimension are necessary but not sufficient (a reordered corpus or another
    encoder of the same width passes them), so a few passages are re-encoded here and must point
    the same way (cosine >= 0.99; float16 storage moves a MiniLM vector by ~1e-4)."""
    if vectors.shape[0] != len(corpus):
        raise IndexMismatchError(f"{source}: {vectors.shape[0]} vectors for a corpus of {len(corpus)} passages "
                                 f"({corpus.path}); they must be one per corpus line, in file order")
    model = load_embedder(encoder)
    if embedding_dim(model) != vectors.shape[1]:
        raise IndexMismatchError(f"{source}: vectors are {vectors.shape[1]}-d but encoder {encoder!r} makes "
                                 f"{embedding_dim(model)}-d ones")
    n = len(corpus)
    rows = sorted({0, n // 2, n - 1, *np.random.default_rng(0).integers(0, n, SPOT_CHECK_ROWS - 3).tolist()})
    fresh = encode(model, [passage_text(corpus.titles[i], corpus.texts[i]) for i in rows])
    stored = vectors[rows].astype(np.float32)
    stored /= np.maximum(np.linalg.norm(stored, axis=1, keepdims=True), 1e-12)
    cosines = (fresh * stored).sum(1)
    worst = int(np.argmin(cosines))
    if cosines[worst] < SPOT_CHECK_MIN_COSINE:
        raise IndexMismatchError(
            f"{source}: row {rows[worst]} ({corpus.ids[rows[worst]]}) re-encoded with {encoder!r} has cosine "
            f"{cosines[worst]:.3f} to its stored vector; the vectors come from another corpus order or encoder"
        )
