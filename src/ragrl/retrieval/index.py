"""An index on disk: one directory that `load_index(dir)` can serve with nothing else.

Layout::

    manifest.json        kind, params, encoder, embedding dim, corpus sha256/path, rows, version, time
    corpus.jsonl[.gz]    byte-for-byte copy of the corpus it was built from (its sha256 is checked)
    bm25/                BM25 arrays (kinds bm25, hybrid)
    dense/               embeddings.npy [+ hnsw.faiss] (kinds dense, hybrid)

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

import ragrl
from ragrl.errors import IndexMismatchError, RagrlError
from ragrl.models.embedder import canonical_embedder_name
from ragrl.paths import file_lock
from ragrl.retrieval.base import Hit
from ragrl.retrieval.bm25 import BM25Index
from ragrl.retrieval.corpus import Corpus, file_sha256, load_corpus
from ragrl.retrieval.dense import DenseIndex, check_vectors, load_vectors
from ragrl.retrieval.hybrid import HybridIndex

MANIFEST = "manifest.json"
MANIFEST_FORMAT = 1
KINDS = ("bm25", "dense", "hybrid")
DEFAULT_ENCODER = "all-minilm-l6-v2"
# Tunable parameters per kind, with defaults (the manifest records the values actually used).
DEFAULT_PARAMS = {
    "bm25": {"k1": 0.9, "b": 0.4},
    "dense": {},
    "hybrid": {"k1": 0.9, "b": 0.4, "k_rrf": 60},
}
REQUIRED_KEYS = ("format", "kind", "params", "encoder", "corpus_sha256", "corpus_file", "rows")


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
    batch_size: int = 64,
    progress: bool = True,
    vectors: str | Path | None = None,
    **params,
) -> Path:
    """Build a `kind` index of the corpus at `out_dir` (replacing an older index there) and return it.

    `vectors`: a .npy of precomputed passage embeddings [rows, dim] (one per corpus line, in file
    order) to use instead of encoding the corpus; checked against the corpus and the encoder
    (`dense.check_vectors`) before anything is written."""
    if kind not in KINDS:
        raise RagrlError(f"unknown index kind {kind!r}; choose one of {', '.join(KINDS)}")
    unknown = sorted(set(params) - set(DEFAULT_PARAMS[kind]))
    if unknown:
        raise RagrlError(f"unknown parameter(s) for a {kind} index: {', '.join(unknown)}")
    params = {**DEFAULT_PARAMS[kind], **params}
    corpus_path = Path(corpus_path)
    corpus = load_corpus(corpus_path)  # validate before touching out_dir
    if vectors is not None and kind == "bm25":
        raise RagrlError("--vectors is for dense and hybrid indexes; a bm25 index has no vectors")
    precomputed = None
    if vectors is not None:
        precomputed = load_vectors(vectors)
        check_vectors(precomputed, corpus, encoder, source=str(vectors))
    out_dir = Path(out_dir).expanduser().absolute()
    _check_replaceable(out_dir)

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_dir.parent / f".{out_dir.name}.tmp-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        with open(corpus_path, "rb") as f:
            corpus_file = "corpus.jsonl.gz" if f.read(2) == b"\x1f\x8b" else "corpus.jsonl"
        shutil.copyfile(corpus_path, tmp / corpus_file)
        if file_sha256(tmp / corpus_file) != corpus.sha256:
            raise RagrlError(f"{corpus_path} changed while the index was being built; build again")
        encoder_name, dim = None, None
        if kind == "bm25":
            BM25Index.build(corpus, k1=params["k1"], b=params["b"], progress=progress).save(tmp / "bm25")
        else:
            encoder_name = canonical_embedder_name(encoder)
            params["hnsw"] = bool(hnsw)
            if kind == "hybrid":
                BM25Index.build(corpus, k1=params["k1"], b=params["b"], progress=progress).save(tmp / "bm25")
            if precomputed is not None:
                dense = DenseIndex.from_vectors(corpus, encoder_name, precomputed, hnsw=hnsw)
                params["vectors_sha256"] = file_sha256(vectors)
            else:
                dense = DenseIndex.build(corpus, encoder_name, hnsw=hnsw, batch_size=batch_size, progress=progress)
            dense.save(tmp / "dense")
            dim = dense.dim
        manifest = {
            "format": MANIFEST_FORMAT,
            "kind": kind,
            "params": params,
            "encoder": encoder_name,
            "embedding_dim": dim,
            "corpus_sha256": corpus.sha256,
            "corpus_path": str(corpus_path.absolute()),
            "corpus_file": corpus_file,
            "rows": len(corpus),
            "ragrl_version": ragrl.__version__,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        # The manifest is written last: a directory without one is never a usable index.
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        _swap_into_place(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir


def cached_index(corpus_path: str | Path, out_dir: str | Path, kind: str = "bm25", **kwargs) -> Path:
    """`build_index` unless a finished index (one with a manifest) is already at `out_dir`; for
    caches keyed by content. Under a file lock: the ranks of a distributed run all ask for the
    same cached index at once, and a second builder would rename the first one's index away
    while that rank was loading it."""

    out_dir = Path(out_dir)
    if (out_dir / MANIFEST).is_file():
        return out_dir
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(out_dir.parent / f".{out_dir.name}.lock"):
        if not (out_dir / MANIFEST).is_file():   # nobody finished it while we waited
            # A builder killed mid-way (SIGKILL skips its cleanup) leaves its half-written temporary
            # folder; holding the lock, no live builder of this cache owns one, so they can go.
            for stale in out_dir.parent.glob(f".{out_dir.name}.tmp-*"):
                shutil.rmtree(stale, ignore_errors=True)
            build_index(corpus_path, out_dir, kind, **kwargs)
    return out_dir


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
    if manifest["format"] != MANIFEST_FORMAT:
        raise RagrlError(f"{path}: manifest format {manifest['format']!r} is not supported (expected {MANIFEST_FORMAT})")
    if manifest["kind"] not in KINDS:
        raise RagrlError(f"{path}: unknown index kind {manifest['kind']!r}")
    return manifest


def load_index(index_dir: str | Path, *, corpus: str | Path | None = None, encoder: str | None = None) -> SearchIndex:
    """Open an index. `corpus`/`encoder`, when given, must match what it was built with
    (IndexMismatchError otherwise); None skips that check."""
    index_dir = Path(index_dir)
    manifest = read_manifest(index_dir)
    if corpus is not None:
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
        # Imported only here: a BM25-only process never loads ragrl.models (torch, transformers).

        if canonical_embedder_name(encoder) != manifest["encoder"]:
            raise IndexMismatchError(
                f"index {index_dir} was built with encoder {manifest['encoder']!r}, not {encoder!r}"
            )

    passages = load_corpus(index_dir / manifest["corpus_file"])
    if passages.sha256 != manifest["corpus_sha256"] or len(passages) != manifest["rows"]:
        raise RagrlError(f"{index_dir}: stored corpus copy does not match the manifest (corrupt index); rebuild it")
    return SearchIndex(index_dir, manifest, _load_backend(index_dir, manifest, passages))


def _load_backend(index_dir: Path, manifest: dict, passages: Corpus):
    kind, params = manifest["kind"], manifest["params"]
    if kind == "bm25":
        return BM25Index.load(index_dir / "bm25", passages)

    dense = DenseIndex.load(index_dir / "dense", passages, manifest["encoder"], hnsw=bool(params.get("hnsw")))
    if kind == "dense":
        return dense

    bm25 = BM25Index.load(index_dir / "bm25", passages)
    return HybridIndex(bm25, dense, k_rrf=float(params.get("k_rrf", 60)))
