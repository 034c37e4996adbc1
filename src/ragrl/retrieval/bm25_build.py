"""A BM25 index built a chunk of passages at a time: memory bounded by a chunk, not the corpus.

bm25s's own `index` takes every passage's tokens as Python lists at once (tens of GB for wiki-18).
This builds the same index (bm25s's tokenizer, its Lucene BM25 and its files, so `bm25s.BM25.load`
reads it) in three steps over chunks of `chunk_rows` passages:

1. tokenize each chunk (stemmed, stopwords out, as `BM25Index.build`) and write its per-passage
   token counts to `work/chunk_NNNNN.npz` (written whole, then renamed: a killed build resumes
   after the last finished chunk);
2. merge the chunks' vocabularies, count document frequencies and lengths: idf and the mean length;
3. score each chunk's (passage, token) pairs and write them into the index's column-major (CSC)
   arrays, memory-mapped on disk, column by column.

Scores are computed with bm25s's arithmetic (float32 term frequencies, float64 length
normalisation, float32 idf), so the top-k equals an in-memory bm25s build's.
"""
from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from pathlib import Path

import bm25s
import numpy as np
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from ragrl.retrieval.corpus import Corpus

CHUNK_ROWS = 50_000
_CHUNK = "chunk_{:05d}.npz"
_IDENTITY = "build.json"
TOKENIZER = "bm25s regex, english stopwords, snowball english stemmer; title + '. ' + text"


def _claim_work_dir(work_dir: Path, identity: dict) -> None:
    """Keep the finished chunks of an earlier build of the same corpus and settings; clear any other."""
    work_dir.mkdir(parents=True, exist_ok=True)
    marker = work_dir / _IDENTITY
    try:
        same = json.loads(marker.read_text()) == identity
    except (OSError, ValueError):
        same = False
    if not same:
        for old in work_dir.iterdir():
            old.unlink()
        marker.write_text(json.dumps(identity))


def build_bm25_files(corpus: Corpus, out_dir: str | Path, work_dir: str | Path, *, k1: float, b: float,
                     tokenize: Callable[[list[str]], list[list[str]]], chunk_rows: int = CHUNK_ROWS,
                     progress: Callable[[str, int, int], None] | None = None) -> None:
    """Write bm25s's index files for `corpus` into `out_dir`; `work_dir` keeps finished chunks across
    a killed build (the caller removes it once the index is in place). `progress(stage, done, total)`."""
    out_dir, work_dir = Path(out_dir), Path(work_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    n = len(corpus)
    _claim_work_dir(work_dir, {"corpus_sha256": corpus.sha256, "rows": n, "chunk_rows": chunk_rows,
                               "tokenizer": TOKENIZER})
    starts = list(range(0, n, chunk_rows))
    for c, start in enumerate(starts):          # 1. tokenize, a chunk at a time (resumable)
        path = work_dir / _CHUNK.format(c)
        if not path.is_file():
            _write_chunk(corpus, start, min(start + chunk_rows, n), tokenize, path)
        if progress:
            progress("tokenize", min(start + chunk_rows, n), n)

    vocab: dict[str, int] = {}                    # 2. vocabulary, document frequencies, lengths
    df_parts, lengths = [], []
    for c in range(len(starts)):
        chunk = _read_chunk(work_dir / _CHUNK.format(c))
        gids = np.array([vocab.setdefault(t, len(vocab)) for t in chunk["vocab"]], dtype=np.int64)
        df_parts.append(np.bincount(gids[chunk["tokens"]], minlength=0))
        lengths.append(chunk["lengths"])
    df = np.zeros(len(vocab) + 1, dtype=np.int64)   # + bm25s's empty token "", last, in no passage
    for part in df_parts:
        df[: len(part)] += part
    vocab[""] = len(vocab)
    avg_len = np.concatenate(lengths).mean()        # as bm25s: the mean over passages, float64
    idf = np.zeros(len(df), dtype=np.float32)
    seen = df > 0
    idf[seen] = [math.log(1 + (n - d + 0.5) / (d + 0.5)) for d in df[seen].tolist()]

    indptr = np.zeros(len(df) + 1, dtype=np.int64)  # 3. scores into CSC columns, on disk
    np.cumsum(df, out=indptr[1:])
    nnz = int(indptr[-1])
    data = np.lib.format.open_memmap(out_dir / "data.csc.index.npy", mode="w+", dtype=np.float32, shape=(nnz,))
    rows = np.lib.format.open_memmap(out_dir / "indices.csc.index.npy", mode="w+", dtype=np.int32, shape=(nnz,))
    cursor = indptr[:-1].copy()
    for c, start in enumerate(starts):
        chunk = _read_chunk(work_dir / _CHUNK.format(c))
        gids = np.array([vocab[t] for t in chunk["vocab"]], dtype=np.int64)[chunk["tokens"]]
        doc = start + np.repeat(np.arange(len(chunk["lengths"])), np.diff(chunk["offsets"]))
        tf = chunk["counts"].astype(np.float32)
        length = chunk["lengths"][doc - start]
        # bm25s's Lucene scoring, operation for operation (see bm25s.scoring).
        tfc = tf / (k1 * ((1 - b) + b * length / avg_len) + tf)
        score = (idf[gids] * tfc).astype(np.float32)
        order = np.lexsort((doc, gids))
        g_sorted = gids[order]
        first = np.r_[0, np.flatnonzero(np.diff(g_sorted)) + 1]
        counts = np.diff(np.r_[first, len(g_sorted)])
        rank = np.arange(len(g_sorted)) - np.repeat(first, counts)
        pos = cursor[g_sorted] + rank
        data[pos] = score[order]
        rows[pos] = doc[order]
        cursor[g_sorted[first]] += counts
        if progress:
            progress("score", min(start + chunk_rows, n), n)
    data.flush()
    rows.flush()
    del data, rows
    np.save(out_dir / "indptr.csc.index.npy", indptr)
    (out_dir / "vocab.index.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    params = {"k1": k1, "b": b, "delta": 0.5, "method": "lucene", "idf_method": "lucene", "dtype": "float32",
              "int_dtype": "int32", "num_docs": n, "version": bm25s.__version__, "backend": "numpy"}
    (out_dir / "params.index.json").write_text(json.dumps(params, indent=4))


def _write_chunk(corpus: Corpus, start: int, end: int, tokenize, path: Path) -> None:
    vocab: dict[str, int] = {}
    offsets, tokens, counts, lengths = [0], [], [], []
    texts = []
    for i in range(start, end):
        p = corpus.passage(i)
        # The title is indexed with the text, as BM25Index.build does.
        texts.append(f"{p['title']}. {p['text']}")
    for doc in tokenize(texts):
        ids = np.array([vocab.setdefault(t, len(vocab)) for t in doc], dtype=np.int64)
        unique, tf = np.unique(ids, return_counts=True)
        tokens.append(unique)
        counts.append(tf)
        offsets.append(offsets[-1] + len(unique))
        lengths.append(len(doc))
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        # The chunk's vocabulary as one UTF-8 blob, a token a line (tokens are \w runs: no newline in
        # them); a fixed-width string array would pad every token to the longest one's width.
        np.savez(f, vocab=np.frombuffer("\n".join(vocab).encode("utf-8"), dtype=np.uint8),
                 offsets=np.array(offsets, dtype=np.int64),
                 tokens=np.concatenate(tokens).astype(np.int32) if tokens else np.array([], dtype=np.int32),
                 counts=np.concatenate(counts).astype(np.int32) if counts else np.array([], dtype=np.int32),
                 lengths=np.array(lengths, dtype=np.int32))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _read_chunk(path: Path) -> dict:
    with np.load(path, allow_pickle=False) as z:
        blob = z["vocab"].tobytes().decode("utf-8")
        return {"vocab": blob.split("\n") if blob else [], "offsets": z["offsets"], "tokens": z["tokens"],
                "counts": z["counts"], "lengths": z["lengths"]}


class ChunkProgress:
    """Progress of an index build with the time left: one rich bar per stage."""

    def __init__(self, what: str):
        self.what = what
        self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                            TimeRemainingColumn(), transient=True)
        self.tasks: dict[str, int] = {}

    def __call__(self, stage: str, done: int, total: int) -> None:
        if stage not in self.tasks:
            if not self.tasks:
                self.bar.start()
            self.tasks[stage] = self.bar.add_task(f"{self.what}: {stage}", total=total)
        self.bar.update(self.tasks[stage], completed=done)

    def close(self) -> None:
        if self.tasks:
            self.bar.stop()
