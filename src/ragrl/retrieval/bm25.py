"""Sparse retrieval: BM25 over stemmed, stopword-filtered tokens (bm25s + PyStemmer).

k1=0.9, b=0.4 are the Anserini/Pyserini defaults; they are a good fit for short Wikipedia
paragraphs such as HotpotQA's (less length normalisation than the textbook b=0.75).
"""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import bm25s
import numpy as np
import Stemmer

from ragrl.errors import RagrlError
from ragrl.retrieval.base import Hit
from ragrl.retrieval import bm25_build
from ragrl.retrieval.bm25_build import ChunkProgress, build_bm25_files
from ragrl.retrieval.corpus import Corpus

PARAMS_FILE = "ragrl_bm25.json"

# bm25s logs an INFO line for every empty query; an all-stopword query is normal input here.
logging.getLogger("bm25s").setLevel(logging.WARNING)


def _stemmer() -> Stemmer.Stemmer:
    return Stemmer.Stemmer("english")


class BM25Index:
    """BM25 over a `Corpus`; `search` answers a batch of queries with ranked `Hit`s."""

    def __init__(self, corpus: Corpus, retriever: bm25s.BM25, *, k1: float, b: float):
        self.corpus = corpus
        self.retriever = retriever
        self.k1, self.b = k1, b

    @classmethod
    def build(cls, corpus: Corpus, *, k1: float = 0.9, b: float = 0.4, progress: bool = False) -> "BM25Index":
        """An index in memory (bm25s's own build: every passage's tokens at once). Index folders are
        written by `write`, a chunk at a time, which is tested to give the same top-k as this."""
        stemmer = _stemmer()
        # The title is indexed with the text: HotpotQA questions often name the page's entity.
        docs = [f"{title}. {text}" for title, text in zip(corpus.titles, corpus.texts)]
        tokens = bm25s.tokenize(docs, stopwords="en", stemmer=stemmer, show_progress=progress)
        retriever = bm25s.BM25(k1=k1, b=b)
        retriever.index(tokens, show_progress=progress)
        return cls(corpus, retriever, k1=k1, b=b)

    @classmethod
    def write(cls, corpus: Corpus, directory: str | Path, work_dir: str | Path, *, k1: float = 0.9, b: float = 0.4,
              progress: bool = False, chunk_rows: int | None = None) -> None:
        """Write the index of `corpus` into `directory` a chunk of passages at a time (bm25_build):
        what `build(...).save(directory)` writes, without the corpus's tokens all in memory.
        `work_dir` keeps finished chunks, so a killed build started again resumes there."""
        bar = ChunkProgress("BM25") if progress else None
        try:
            build_bm25_files(corpus, directory, work_dir, k1=k1, b=b, chunk_rows=chunk_rows or bm25_build.CHUNK_ROWS,
                             progress=bar,
                             tokenize=lambda texts: bm25s.tokenize(texts, stopwords="en", stemmer=_stemmer(),
                                                                   return_ids=False, show_progress=False))
        finally:
            if bar is not None:
                bar.close()
        (Path(directory) / PARAMS_FILE).write_text(json.dumps({"k1": k1, "b": b, "rows": len(corpus)}))

    def __len__(self) -> int:
        return len(self.corpus)

    def tokenize_queries(self, queries: list[str]) -> list[list[str]]:
        """Stemmed, stopword-free tokens per query (may be empty, e.g. "what is the")."""
        # A fresh stemmer per call: PyStemmer objects are not thread-safe, and servers search
        # from several threads; making one costs microseconds.
        return bm25s.tokenize(
            queries, stopwords="en", stemmer=_stemmer(), return_ids=False, show_progress=False
        )

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        """Top-k hits per query. Passages sharing no term with the query (score 0) are dropped,
        so a query of only stopwords or unknown words returns fewer than k hits, possibly none."""
        if not queries:
            return []
        k = min(int(k), len(self.corpus))
        if k <= 0:
            return [[] for _ in queries]
        tokens = self.tokenize_queries(list(queries))
        # Threads only pay off on large batches; bm25s scores each query separately.
        n_threads = 0 if len(queries) < 64 else min(4, os.cpu_count() or 1)
        rows, scores = self.retriever.retrieve(
            tokens, k=k, show_progress=False, n_threads=n_threads, chunksize=16
        )
        return [
            [self.corpus.hit(int(i), s) for i, s in zip(row_ids, row_scores) if s > 0]
            for row_ids, row_scores in zip(np.asarray(rows), np.asarray(scores))
        ]

    def save(self, directory: str | Path) -> None:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.retriever.save(str(directory), show_progress=False)
        (directory / PARAMS_FILE).write_text(json.dumps({"k1": self.k1, "b": self.b, "rows": len(self.corpus)}))

    @classmethod
    def load(cls, directory: str | Path, corpus: Corpus) -> "BM25Index":
        directory = Path(directory)
        try:
            params = json.loads((directory / PARAMS_FILE).read_text())
            # Memory-mapped: wiki-18's score arrays are ~10 GB; pages are read as queries touch them.
            retriever = bm25s.BM25.load(str(directory), show_progress=False, mmap=True)
        except (OSError, ValueError, KeyError) as e:
            raise RagrlError(f"{directory}: BM25 index files are missing or corrupt ({e})") from None
        rows = int(retriever.scores["num_docs"])
        if rows != len(corpus) or params.get("rows") != rows:
            raise RagrlError(f"{directory}: BM25 index has {rows} rows but its corpus has {len(corpus)}")
        return cls(corpus, retriever, k1=float(params["k1"]), b=float(params["b"]))
