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

if TYPE_CHECKING:
    import faiss


def _faiss():
    """faiss, imported when a dense index is built or read, not with ragrl.retrieval: a BM25-only run
    never needs it, and a lent GPU machine lacks the wheel (18 MiB of a call's 64 MiB carry)."""
    import faiss  # late: only dense indexes need it (see the docstring)
    return faiss


EMBEDDINGS_FILE = "embeddings.npy"
HNSW_FILE = "hnsw.faiss"
HNSW_NEIGHBOURS = 32  # graph degree M: the usual recall/memory balance for 384-d vectors
HNSW_EF_CONSTRUCTION = 80


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
    dim = embeddings.shape[1]
    if hnsw:
        index = _faiss().IndexHNSWFlat(dim, HNSW_NEIGHBOURS, _faiss().METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = HNSW_EF_CONSTRUCTION
    else:
        index = _faiss().IndexFlatIP(dim)
    index.add(embeddings)
    return index


class DenseIndex:
    """Cosine-similarity search over passage embeddings [rows, dim]."""

    def __init__(self, corpus: Corpus, encoder: str, embeddings: np.ndarray, index: faiss.Index, *, hnsw: bool):
        self.corpus = corpus
        self.encoder = encoder
        self.embeddings = embeddings  # [rows, dim] float32, unit norm (kept for rerankers/HARR)
        self.index = index
        self.hnsw = hnsw
        self.model = load_embedder(encoder)

    @property
    def dim(self) -> int:
        return int(self.embeddings.shape[1])

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
            list(queries), batch_size=16, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False
        ).astype(np.float32, copy=False)

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        if not queries:
            return []
        k = min(int(k), len(self.corpus))
        if k <= 0:
            return [[] for _ in queries]
        return self.search_vectors(self.encode_queries(queries), k)

    def search_vectors(self, query_vectors: np.ndarray, k: int) -> list[list[Hit]]:
        """Top-k hits for precomputed query embeddings [n, dim]."""
        # The HNSW beam must be at least k wide; passed per call so concurrent searches don't race.
        params = _faiss().SearchParametersHNSW(efSearch=max(64, 2 * k)) if self.hnsw else None
        vectors = np.ascontiguousarray(query_vectors, dtype=np.float32)
        scores, rows = self.index.search(vectors, k, params=params)
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
            _faiss().write_index(self.index, str(directory / HNSW_FILE))

    @classmethod
    def load(cls, directory: str | Path, corpus: Corpus, encoder: str, *, hnsw: bool = False) -> "DenseIndex":
        directory = Path(directory)
        try:
            embeddings = np.load(directory / EMBEDDINGS_FILE)
            # A flat index is rebuilt from the vectors (a memcpy); an HNSW graph is costly to rebuild.
            index = _faiss().read_index(str(directory / HNSW_FILE)) if hnsw else _faiss_index(embeddings, False)
        except (OSError, ValueError, RuntimeError) as e:
            raise RagrlError(f"{directory}: dense index files are missing or corrupt ({e})") from None
        if embeddings.ndim != 2 or embeddings.shape[0] != len(corpus) or index.ntotal != len(corpus):
            raise RagrlError(
                f"{directory}: dense index has {index.ntotal} vectors of shape {embeddings.shape} "
                f"but its corpus has {len(corpus)} rows"
            )
        dense = cls(corpus, encoder, embeddings, index, hnsw=hnsw)
        if embedding_dim(dense.model) != dense.dim:
            raise IndexMismatchError(
                f"{directory}: stored vectors are {dense.dim}-d but encoder {encoder!r} makes "
                f"{embedding_dim(dense.model)}-d ones; rebuild the index"
            )
        return dense


# Rows re-encoded to check precomputed vectors: first, middle, last and a few fixed others.
SPOT_CHECK_ROWS = 8
SPOT_CHECK_MIN_COSINE = 0.99


def load_vectors(path: str | Path) -> np.ndarray:
    """A [rows, dim] float array from a .npy file, with a clear error for anything else."""
    try:
        vectors = np.load(Path(path), allow_pickle=False)
    except (OSError, ValueError) as e:
        raise RagrlError(f"{path}: cannot read passage vectors ({e})") from None
    if vectors.ndim != 2 or vectors.dtype.kind != "f":
        raise RagrlError(f"{path}: passage vectors must be a 2-d float array, got {vectors.dtype} {vectors.shape}")
    if not np.isfinite(vectors).all():
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
