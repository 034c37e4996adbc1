"""An index on disk: one directory that `load_index(dir)` can serve with nothing else.

Layout::

    manifest.json        kind, params, encoder, embedding dim, the corpus (path, sha256, size), rows, version, time
    passages/            the corpus's passage table (a plain JSON Lines corpus: read by offset, see passage_file)
    bm25/                BM25 arrays (kinds bm25, hybrid)
    dense/               embeddings.npy [+ hnsw.faiss] (kinds dense, hybrid)

The corpus is not copied: the manifest names it by path (absolute, and relative to the index, so an
index moved together with its corpus still finds it) and identifies it by its sha256, size and
sampled blocks; a changed corpus is refused. A gzipped corpus is read into memory when the index
loads (it cannot be read by offset); a plain one is read a passage at a time. Indexes of format 1
(ragrl before 2026-11-28) hold a copy of their corpus and still load.

`build_index` writes everything into a hidden sibling directory and renames it into place only
when complete, so an interrupted build never leaves a half index where a good one was.
"""
from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from pathlib import Path

import numpy as np

import ragrl
from ragrl.errors import CorpusError, IndexMismatchError, RagrlError
from ragrl.models.embedder import canonical_embedder_name
from ragrl.paths import atomic_write_text, file_lock
from ragrl.retrieval.base import Hit
from ragrl.retrieval.bm25 import BM25Index
from ragrl.retrieval.corpus import Corpus, load_corpus, open_corpus_on_disk, passage_fields
from ragrl.retrieval.bm25_build import ChunkProgress
from ragrl.retrieval.dense import DenseIndex, check_vectors, load_vectors
from ragrl.retrieval.dense_build import FAISS_KINDS, check_rerank
from ragrl.retrieval.hybrid import HybridIndex
from ragrl.retrieval.passage_file import check_unchanged, file_sha256, fingerprint, is_gzip, write_passage_table

MANIFEST = "manifest.json"
MANIFEST_FORMAT = 2
READABLE_FORMATS = (1, 2)
KINDS = ("bm25", "dense", "hybrid")
DEFAULT_ENCODER = "all-minilm-l6-v2"
# Tunable parameters per kind, with defaults (the manifest records the values actually used).
DEFAULT_PARAMS = {
    "bm25": {"k1": 0.9, "b": 0.4},
    "dense": {},
    "hybrid": {"k1": 0.9, "b": 0.4, "k_rrf": 60},
}
REQUIRED_KEYS = ("format", "kind", "params", "encoder", "corpus_sha256", "rows")
CORPUS_KEYS = {1: "corpus_file", 2: "corpus"}   # format 1: a copy in the folder; 2: where it is


class SearchIndex:
    """A loaded index: a `Retriever` plus the manifest and corpus it was built from."""

    def __init__(self, path: Path, manifest: dict, backend):
        self.path = path
        self.manifest = manifest
        self.backend = backend  # BM25Index | DenseIndex | HybridIndex

    @property
    def kind(self) -> str:
        return self.manifest["kind"]

    @property
    def corpus(self) -> Corpus:
        return self.backend.corpus

    def __len__(self) -> int:
        return len(self.backend)

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        """Top-k hits per query, best first (see the backend for how ties and k > rows behave)."""
        return self.backend.search(list(queries), k)

    def __repr__(self) -> str:
        return f"SearchIndex(kind={self.kind!r}, rows={len(self)}, path={str(self.path)!r})"


def build_index(
    corpus_path: str | Path,
    out_dir: str | Path,
    kind: str = "bm25",
    *,
    encoder: str = DEFAULT_ENCODER,
    hnsw: bool = False,
    dense_index: str | None = None,
    nlist: int | None = None,
    pq_m: int | None = None,
    rerank: int | None = None,
    recall_queries: int = 0,
    batch_size: int = 64,
    progress: bool = True,
    vectors: str | Path | None = None,
    **params,
) -> Path:
    """Build a `kind` index of the corpus at `out_dir` (replacing an older index there) and return it.

    Both halves stream (a chunk of passages at a time) and a killed build started again resumes
    after its last finished chunk. `dense_index`: flat (exact), hnsw, ivf_sq8 or ivf_pq (dense_build;
    `hnsw=True` is the same as "hnsw"), with `nlist` / `pq_m` / `rerank` (candidates per hit re-scored
    from the vectors; None: ivf_pq 10, else off) for the IVF kinds and recall@10 against
    flat search measured on `recall_queries` passage vectors. `vectors`: a .npy of precomputed passage
    embeddings [rows, dim] (one per corpus line, in file order) to use instead of encoding the
    corpus; checked against the corpus and the encoder (`dense.check_vectors`) before anything is written."""
    if kind not in KINDS:
        raise RagrlError(f"unknown index kind {kind!r}; choose one of {', '.join(KINDS)}")
    unknown = sorted(set(params) - set(DEFAULT_PARAMS[kind]))
    if unknown:
        raise RagrlError(f"unknown parameter(s) for a {kind} index: {', '.join(unknown)}")
    params = {**DEFAULT_PARAMS[kind], **params}
    dense_index = dense_index or ("hnsw" if hnsw else "flat")
    if dense_index not in FAISS_KINDS:
        raise RagrlError(f"unknown dense index {dense_index!r}; choose one of {', '.join(FAISS_KINDS)}")
    if kind == "bm25" and (vectors is not None or dense_index != "flat" or nlist or pq_m or rerank):
        raise RagrlError("--vectors, --dense, --nlist, --pq-m and --rerank are for dense and hybrid indexes; "
                         "a bm25 index has no vectors")
    check_rerank(dense_index, rerank)
    precomputed = load_vectors(vectors) if vectors is not None else None
    with StagedIndex(corpus_path, out_dir) as stage:
        corpus = stage.corpus
        if precomputed is not None:
            check_vectors(precomputed, corpus, encoder, source=str(vectors))
        encoder_name, dim = None, None
        bar = ChunkProgress("index") if progress else None
        try:
            if kind in ("bm25", "hybrid"):
                BM25Index.write(corpus, stage.tmp / "bm25", stage.work_dir / "bm25", k1=params["k1"], b=params["b"],
                                progress=progress)
            if kind != "bm25":
                encoder_name = canonical_embedder_name(encoder)
                params.update(DenseIndex.write(corpus, stage.tmp / "dense", stage.work_dir / "dense", encoder_name,
                                               index=dense_index, batch_size=batch_size, vectors=precomputed,
                                               nlist=nlist, pq_m=pq_m, rerank=rerank, recall_queries=recall_queries,
                                               progress=bar))
                params["hnsw"] = dense_index == "hnsw"
                if precomputed is not None:
                    params["vectors_sha256"] = file_sha256(vectors)
                dim = int(precomputed.shape[1]) if precomputed is not None else np.load(
                    stage.tmp / "dense" / "embeddings.npy", mmap_mode="r").shape[1]
        finally:
            if bar is not None:
                bar.close()
        stage.finish(kind=kind, params=params, encoder=encoder_name, embedding_dim=dim)
    return stage.out_dir


class StagedIndex:
    """An index folder being written: `with StagedIndex(corpus, out) as stage:` checks the corpus
    row by row into `stage.corpus` (a plain file through its passage table, read by offset; a gzipped
    one in memory) inside a hidden sibling folder `stage.tmp`; `stage.finish(...)` writes the manifest
    last, and leaving the block renames the folder into place. An error (or no `finish`) removes the
    folder and leaves whatever was at `out_dir` as it was."""

    def __init__(self, corpus_path: str | Path, out_dir: str | Path):
        self.corpus_path = Path(corpus_path).absolute()
        if not self.corpus_path.is_file():
            raise RagrlError(f"{self.corpus_path}: corpus file not found")
        self.out_dir = Path(out_dir).expanduser().absolute()
        _check_replaceable(self.out_dir)
        # Work that outlives a killed build (finished chunks); removed once the index is in place.
        self.work_dir = self.out_dir.parent / f".{self.out_dir.name}.build"
        self.finished = False

    def __enter__(self) -> "StagedIndex":
        self.out_dir.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = self.out_dir.parent / f".{self.out_dir.name}.tmp-{uuid.uuid4().hex[:8]}"
        self.tmp.mkdir()
        self.before = self.corpus_path.stat()
        try:
            if is_gzip(self.corpus_path):
                self.corpus, self.storage = load_corpus(self.corpus_path), "memory"
            else:
                _, sha = write_passage_table(self.corpus_path, self.tmp, passage_fields)
                self.corpus, self.storage = open_corpus_on_disk(self.corpus_path, self.tmp, sha), "disk"
        except BaseException:
            shutil.rmtree(self.tmp, ignore_errors=True)
            raise
        return self

    def finish(self, **fields) -> None:
        """Write the manifest (`fields`: kind, params, encoder, embedding_dim) with the corpus's identity."""
        identity = fingerprint(self.corpus_path, self.corpus.sha256)
        if (identity["bytes"], identity["mtime_ns"]) != (self.before.st_size, self.before.st_mtime_ns):
            raise RagrlError(f"{self.corpus_path} changed while the index was being built; build again")
        manifest = {
            "format": MANIFEST_FORMAT,
            **fields,
            "corpus_sha256": self.corpus.sha256,
            "corpus_path": str(self.corpus_path),
            "corpus": {**identity, "path": str(self.corpus_path), "storage": self.storage,
                       "relpath": os.path.relpath(self.corpus_path, self.out_dir)},
            "rows": len(self.corpus),
            "ragrl_version": ragrl.__version__,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        # The manifest is written last: a directory without one is never a usable index.
        (self.tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        self.finished = True

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None and self.finished:
            try:
                _swap_into_place(self.tmp, self.out_dir)
                shutil.rmtree(self.work_dir, ignore_errors=True)
                return
            except BaseException:
                shutil.rmtree(self.tmp, ignore_errors=True)
                raise
        shutil.rmtree(self.tmp, ignore_errors=True)


def cached_index(corpus_path: str | Path, out_dir: str | Path, kind: str = "bm25", **kwargs) -> Path:
    """`build_index` unless a finished index (one with a manifest) is already at `out_dir`; for
    caches keyed by content. Under a file lock: the ranks of a distributed run all ask for the
    same cached index at once, and a second builder would rename the first one's index away
    while that rank was loading it."""

    out_dir = Path(out_dir)
    if (out_dir / MANIFEST).is_file() and not _needs_repoint(out_dir):
        return out_dir
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(out_dir.parent / f".{out_dir.name}.lock"):
        if (out_dir / MANIFEST).is_file():
            if _needs_repoint(out_dir):
                _repoint_corpus(out_dir, Path(corpus_path))
        else:   # nobody finished it while we waited
            # A builder killed mid-way (SIGKILL skips its cleanup) leaves its half-written temporary
            # folder; holding the lock, no live builder of this cache owns one, so they can go.
            for stale in out_dir.parent.glob(f".{out_dir.name}.tmp-*"):
                shutil.rmtree(stale, ignore_errors=True)
            build_index(corpus_path, out_dir, kind, **kwargs)
    return out_dir


def _needs_repoint(out_dir: Path) -> bool:
    """Whether a cached index's corpus record points at a file that is gone or is another size now.
    A cache is keyed by content, so a user who built it from one clone and deleted that clone (or a
    test's temporary folder) asks again with the same content at another path."""
    manifest = read_manifest(out_dir)
    if manifest["format"] == 1:   # holds its own copy
        return False
    where = corpus_location(out_dir, manifest)
    return not where.is_file() or where.stat().st_size != manifest["corpus"]["bytes"]


def _repoint_corpus(out_dir: Path, corpus_path: Path) -> None:
    """Point a cached index's manifest at `corpus_path`, which must hold the content it was built
    from (IndexMismatchError otherwise: the cache key and the file disagree). Under the cache's lock;
    the manifest is replaced by a rename, so a process loading it meanwhile reads the old or the new."""
    manifest = read_manifest(out_dir)
    recorded = manifest["corpus"]
    identity = fingerprint(corpus_path)
    if identity["sha256"] != recorded["sha256"]:
        raise IndexMismatchError(f"cached index {out_dir} was built from corpus sha256 {recorded['sha256']}, "
                                 f"but {corpus_path} has sha256 {identity['sha256']}; delete {out_dir} to rebuild")
    manifest["corpus_path"] = str(corpus_path)
    manifest["corpus"] = {**recorded, **identity, "path": str(corpus_path),
                          "relpath": os.path.relpath(corpus_path, out_dir)}
    atomic_write_text(out_dir / MANIFEST, json.dumps(manifest, indent=2) + "\n")


def _check_replaceable(out_dir: Path) -> None:
    """Only an older index (or nothing, or an empty folder) may be replaced: never a user's folder."""
    if not out_dir.exists():
        return
    if not out_dir.is_dir():
        raise RagrlError(f"{out_dir} exists and is not a directory; choose another --out")
    if any(out_dir.iterdir()) and not (out_dir / MANIFEST).is_file():
        raise RagrlError(f"{out_dir} is a non-empty directory that is not a ragrl index; refusing to replace it")


def _swap_into_place(tmp: Path, out_dir: Path) -> None:
    # Two renames: POSIX cannot atomically replace a non-empty directory, so the old index is moved
    # aside first and restored if the second rename fails.
    old = None
    if out_dir.exists():
        old = out_dir.parent / f".{out_dir.name}.old-{uuid.uuid4().hex[:8]}"
        os.rename(out_dir, old)
    try:
        os.rename(tmp, out_dir)
    except BaseException:
        if old is not None:
            os.rename(old, out_dir)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def read_manifest(index_dir: str | Path) -> dict:
    """The validated manifest of an index directory (RagrlError naming the problem otherwise)."""
    path = Path(index_dir) / MANIFEST
    if not path.is_file():
        raise RagrlError(f"{index_dir}: not an index ({MANIFEST} missing); build one with `ragrl index build`")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise RagrlError(f"{path}: corrupt manifest ({e}); rebuild the index") from None
    if not isinstance(manifest, dict):
        raise RagrlError(f"{path}: corrupt manifest (not a JSON object); rebuild the index")
    missing = [key for key in REQUIRED_KEYS if key not in manifest]
    if missing:
        raise RagrlError(f"{path}: corrupt manifest (missing {', '.join(missing)}); rebuild the index")
    if manifest["format"] not in READABLE_FORMATS:
        raise RagrlError(f"{path}: manifest format {manifest['format']!r} is not supported (expected one of "
                         f"{', '.join(map(str, READABLE_FORMATS))})")
    if CORPUS_KEYS[manifest["format"]] not in manifest:
        raise RagrlError(f"{path}: corrupt manifest (missing {CORPUS_KEYS[manifest['format']]}); rebuild the index")
    if manifest["kind"] not in KINDS:
        raise RagrlError(f"{path}: unknown index kind {manifest['kind']!r}")
    return manifest


def corpus_location(index_dir: str | Path, manifest: dict) -> Path:
    """The corpus file an index reads: its copy (format 1), else the path relative to the index if
    a file is there (an index moved together with its corpus), else the absolute path it was built from."""
    index_dir = Path(index_dir)
    if manifest["format"] == 1:
        return index_dir / manifest["corpus_file"]
    return _located(index_dir, manifest["corpus"])


def _located(index_dir: Path, record: dict) -> Path:
    """A file an index names but does not hold: at its path relative to the index if it is there
    (the two were moved together), else at the absolute path it had."""
    relative = Path(os.path.normpath(index_dir / record["relpath"]))
    return relative if relative.is_file() else Path(record["path"])


def _faiss_location(index_dir: Path, record: dict) -> Path:
    """The faiss file an imported index searches, refused if missing or another size than when imported."""
    where = _located(index_dir, record)
    if not where.is_file():
        raise RagrlError(f"index {index_dir} searches the faiss file {record['path']}, which is not there; put it back")
    if where.stat().st_size != record["bytes"]:
        raise IndexMismatchError(f"index {index_dir}: the faiss file {where} is {where.stat().st_size} bytes, "
                                 f"{record['bytes']} when imported; import it again")
    return where


def load_index(index_dir: str | Path, *, corpus: str | Path | None = None, encoder: str | None = None) -> SearchIndex:
    """Open an index. `corpus`, when given, is where its corpus is now (it must be the same file the
    index was built from: IndexMismatchError otherwise); `encoder`, when given, must be the one it
    was built with; None skips that check."""
    index_dir = Path(index_dir)
    manifest = read_manifest(index_dir)
    if corpus is not None and manifest["format"] == 1:
        sha = file_sha256(corpus)
        if sha != manifest["corpus_sha256"]:
            raise IndexMismatchError(
                f"index {index_dir} was built from corpus sha256 {manifest['corpus_sha256']} "
                f"({manifest.get('corpus_path')}), but {corpus} has sha256 {sha}; rebuild the index"
            )
    if encoder is not None and manifest["encoder"] is None:
        raise IndexMismatchError(
            f"index {index_dir} is a {manifest['kind']} index built with no encoder, not with {encoder!r}"
        )
    if encoder is not None:
        if canonical_embedder_name(encoder) != manifest["encoder"]:
            raise IndexMismatchError(
                f"index {index_dir} was built with encoder {manifest['encoder']!r}, not {encoder!r}"
            )
    passages = _open_corpus(index_dir, manifest, None if manifest["format"] == 1 else corpus)
    if passages.sha256 != manifest["corpus_sha256"] or len(passages) != manifest["rows"]:
        raise RagrlError(f"{index_dir}: its corpus ({passages.path}) does not match the manifest "
                         f"({len(passages)} rows, {manifest['rows']} expected); rebuild the index")
    return SearchIndex(index_dir, manifest, _load_backend(index_dir, manifest, passages))


def _open_corpus(index_dir: Path, manifest: dict, corpus: str | Path | None) -> Corpus:
    where = Path(corpus) if corpus is not None else corpus_location(index_dir, manifest)
    if manifest["format"] == 1:
        return load_corpus(where)
    recorded = manifest["corpus"]
    if not where.is_file():
        raise RagrlError(f"index {index_dir} searches the corpus {recorded['path']} (sha256 "
                         f"{recorded['sha256'][:12]}), which is not there; put it back, or pass its new place "
                         f"as load_index(..., corpus=PATH)")
    if recorded["storage"] == "disk":
        check_unchanged(where, recorded, what=f"index {index_dir}")
        return open_corpus_on_disk(where, index_dir, recorded["sha256"])
    # Held in memory: load_corpus hashes the bytes it reads, so the file is read and hashed once, not
    # once to check it and again to load it. A file that no longer parses is checked first against
    # the record, so a replaced corpus is named as such rather than as a malformed one.
    try:
        passages = load_corpus(where)
    except CorpusError:
        check_unchanged(where, recorded, what=f"index {index_dir}")
        raise
    if passages.sha256 != recorded["sha256"]:
        raise IndexMismatchError(f"index {index_dir} was built from corpus sha256 {recorded['sha256']} "
                                 f"({recorded.get('path', where)}), but {where} has sha256 {passages.sha256}; "
                                 "rebuild the index")
    return passages


def _load_backend(index_dir: Path, manifest: dict, passages: Corpus):
    kind, params = manifest["kind"], manifest["params"]
    if kind == "bm25":
        return BM25Index.load(index_dir / "bm25", passages)
    if "faiss" in params:   # a faiss file as the field ships it (faiss_import)
        return DenseIndex.load_faiss(_faiss_location(index_dir, params["faiss"]), passages, manifest["encoder"],
                                     query_prefix=params.get("query_prefix", ""), nprobe=params.get("nprobe"))

    dense = DenseIndex.load(index_dir / "dense", passages, manifest["encoder"], hnsw=bool(params.get("hnsw")),
                            params=params)
    if kind == "dense":
        return dense

    bm25 = BM25Index.load(index_dir / "bm25", passages)
    return HybridIndex(bm25, dense, k_rrf=float(params.get("k_rrf", 60)))
