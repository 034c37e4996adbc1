"""A retriever from its spec: an index folder (in process), an http(s):// URL (the retrieval server),
or nothing (BM25 over a corpus, built once and cached under $RAGRL_HOME)."""
from __future__ import annotations

import hashlib
from pathlib import Path

from ragrl.errors import RagrlError
from ragrl.paths import DEMO_CORPUS, KIT_PREFIX, ragrl_home, resolve_kit
from ragrl.retrieval.base import Retriever
from ragrl.retrieval.client import RetrievalClient
from ragrl.retrieval.index import cached_index, corpus_location, load_index, read_manifest
from ragrl.retrieval.inprocess import InProcessRetriever
from ragrl.retrieval.settings import ServerSettings
from ragrl.retrieval.sharded import SHARD_SEPARATOR, ShardedRetriever


def make_retriever(spec: str | Path, **options) -> Retriever:
    """`http(s)://...` -> RetrievalClient(spec, **options) (commas: replicas); shards' URLs joined by
    `|` -> ShardedRetriever (merged top-k); an index directory -> InProcessRetriever.

    For a directory, `options` may hold `encoder` (passed to load_index) and ServerSettings
    fields; for a URL, RetrievalClient keyword arguments (token, timeout, max_wait_s, ...).
    """
    spec = str(spec)
    if SHARD_SEPARATOR in spec:   # parts of one corpus, each on its own server(s): merged top-k
        parts = [part.strip() for part in spec.split(SHARD_SEPARATOR)]
        if not all(part.startswith(("http://", "https://")) for part in parts):
            raise RagrlError(f"shards {spec!r}: each part must be a retrieval server's http(s):// URL "
                             "(commas within a part name its replicas)")
        return ShardedRetriever([RetrievalClient(part, **options) for part in parts], names=parts)
    if spec.startswith(("http://", "https://")):
        return RetrievalClient(spec, **options)
    if "://" in spec:
        raise RagrlError(f"unsupported retriever URL {spec!r}: use http:// or https://, or an index directory")
    path = Path(spec).expanduser()
    if not path.is_dir():
        raise RagrlError(f"retriever {spec!r} is neither an http(s):// URL nor an existing index directory")
    encoder = options.pop("encoder", None)
    try:
        settings = ServerSettings(**options)
    except TypeError as e:
        raise RagrlError(f"bad option for an in-process retriever: {e}") from None
    return InProcessRetriever(load_index(path, encoder=encoder), settings)


def cached_bm25_index(corpus: str | None) -> Path:
    """Build (once) a BM25 index of `corpus` (default: the bundled demo corpus) under $RAGRL_HOME."""
    path = resolve_kit(corpus) if corpus else DEMO_CORPUS
    digest = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    return cached_index(path, ragrl_home() / "indexes" / f"bm25-{digest}", "bm25", progress=False)


def cached_dense_index(corpus: str | None, vectors: str, encoder: str) -> Path:
    """A dense index over precomputed vectors, built once under $RAGRL_HOME (keyed by both files)."""
    corpus_path, vectors_path = resolve_kit(corpus) if corpus else DEMO_CORPUS, resolve_kit(vectors)
    h = hashlib.sha256()
    for p in (corpus_path, vectors_path):
        h.update(hashlib.sha256(p.read_bytes()).digest())
    return cached_index(corpus_path, ragrl_home() / "indexes" / f"dense-{h.hexdigest()[:16]}", "dense",
                        encoder=encoder, vectors=vectors_path, progress=False)


def corpus_of(index: str | None, corpus: str | None) -> Path:
    """The corpus file whose passages a run searches (by id): `corpus` (a path or `kit:` path), else
    the copy inside the local index folder `index`, else the bundled demo corpus, as `retriever_for`
    picks them. A retrieval server's corpus cannot be read: the demo corpus then."""
    if corpus:
        return resolve_kit(corpus)
    if index and "://" not in index:
        folder = resolve_kit(index)
        return corpus_location(folder, read_manifest(folder))
    return DEMO_CORPUS


def retriever_for(index: str | None, corpus: str | None, *, wait_s: float | None = None) -> Retriever:
    """What a run searches: `index` (a folder, `kit:` path or URL), else BM25 over `corpus`.

    `wait_s`: how long a retrieval server (`index` is a URL) that stops answering is waited for
    (the client's max_wait_s; None: its default). An in-process index never waits: ignored.
    """
    if index and index.startswith(("http://", "https://")):
        return make_retriever(index, **({} if wait_s is None else {"max_wait_s": wait_s}))
    if index:
        return make_retriever(str(resolve_kit(index)) if index.startswith(KIT_PREFIX) else index)
    return make_retriever(str(cached_bm25_index(corpus)))
