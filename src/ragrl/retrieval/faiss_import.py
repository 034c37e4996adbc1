"""The field's dense indexes as they ship: a faiss file over a wiki-18-layout corpus.

Search-R1 and FlashRAG release wiki-18 (21M passages, rows of `id` and `contents`) with a flat
inner-product faiss index of e5 vectors (`e5_Flat.index`, ~60 GB). `import_faiss_index` makes a
ragrl index folder that searches that file where it lies (memory-mapped, never copied or
re-encoded) through the corpus's passage table, with the encoder's query prefix (e5: "query: ").

What is checked before anything is written, each refusal naming the reason: one vector per corpus
line, the encoder's dimension, an inner-product metric, and a few stored vectors against the
encoder's own vectors of those passages (so another encoder, corpus order or passage prefix is
caught; the passage rendering and prefix that match are recorded in the manifest).
"""
from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np

from ragrl.errors import IndexMismatchError, RagrlError
from ragrl.models.embedder import canonical_embedder_name, load_embedder
from ragrl.retrieval.corpus import Corpus
from ragrl.retrieval.dense import check_faiss_index, encode, faiss_module, is_hnsw, passage_text, read_faiss
from ragrl.retrieval.index import StagedIndex

log = logging.getLogger("ragrl.retrieval")

# How the field's indexes render a passage before encoding it: ragrl's "Title. text", and FlashRAG's
# `contents` ("\"Title\"\ntext"), each with no prefix or e5's "passage: ".
RENDERINGS = {"title_text": passage_text, "contents": lambda title, text: f'"{title}"\n{text}'}
PASSAGE_PREFIXES = ("", "passage: ")
CHECK_ROWS = 6
MIN_COSINE = 0.95   # float16/PQ storage moves a vector by far less; another encoder or order by far more


def import_faiss_index(faiss_file: str | Path, corpus_path: str | Path, out_dir: str | Path, *, encoder: str,
                       query_prefix: str = "", passage_prefix: str | None = None,
                       nprobe: int | None = None) -> Path:
    """An index folder at `out_dir` that searches `faiss_file` (row i = corpus line i) with `encoder`.
    `passage_prefix`: what the vectors were encoded with (None: try "" and "passage: ")."""
    faiss_file = Path(faiss_file).expanduser().absolute()
    if not faiss_file.is_file():
        raise RagrlError(f"{faiss_file}: faiss index file not found")
    if nprobe is not None and nprobe < 1:
        raise RagrlError(f"nprobe must be a positive integer, got {nprobe}")
    index = read_faiss(faiss_file)
    model = load_embedder(encoder)
    with StagedIndex(corpus_path, out_dir) as stage:
        check_faiss_index(index, stage.corpus, model, encoder, source=str(faiss_file))
        matched = check_stored_vectors(index, stage.corpus, model, encoder, source=str(faiss_file),
                                       prefixes=PASSAGE_PREFIXES if passage_prefix is None else (passage_prefix,))
        st = faiss_file.stat()
        params = {"hnsw": is_hnsw(index), "query_prefix": query_prefix, "nprobe": nprobe, "passages_as": matched,
                  "faiss": {"path": str(faiss_file), "relpath": os.path.relpath(faiss_file, stage.out_dir),
                            "bytes": st.st_size, "mtime_ns": st.st_mtime_ns,
                            "type": type(faiss_module().downcast_index(index)).__name__}}
        stage.finish(kind="dense", params=params, encoder=canonical_embedder_name(encoder), embedding_dim=int(index.d))
    return stage.out_dir


def check_stored_vectors(index, corpus: Corpus, model, encoder: str, *, source: str, prefixes) -> dict | None:
    """The rendering and prefix under which `encoder` reproduces a few stored vectors (cosine >=
    MIN_COSINE); IndexMismatchError if none does. None (with a warning) where the index cannot give
    its vectors back (an IVF index without a direct map)."""
    n = len(corpus)
    rows = sorted({0, n // 2, n - 1, *np.random.default_rng(0).integers(0, n, CHECK_ROWS - 3).tolist()})
    try:
        stored = np.stack([index.reconstruct(int(r)) for r in rows]).astype(np.float32)
    except RuntimeError:
        log.warning("%s: this faiss index cannot return its vectors, so they were not checked against %r",
                    source, encoder)
        return None
    stored /= np.maximum(np.linalg.norm(stored, axis=1, keepdims=True), 1e-12)
    passages = [corpus.passage(r) for r in rows]
    best = (-2.0, None)
    for name, render in RENDERINGS.items():
        for prefix in prefixes:
            fresh = encode(model, [prefix + render(p["title"], p["text"]) for p in passages])
            worst = float((fresh * stored).sum(1).min())
            best = max(best, (worst, {"rendering": name, "prefix": prefix}), key=lambda b: b[0])
    if best[0] < MIN_COSINE:
        raise IndexMismatchError(
            f"{source}: its vectors are not {encoder!r}'s vectors of this corpus's passages (best lowest cosine "
            f"{best[0]:.3f} over {len(rows)} rows, with renderings {', '.join(RENDERINGS)} and passage prefixes "
            f"{', '.join(map(repr, prefixes))}): another encoder, another corpus order, or another prefix")
    return best[1]
