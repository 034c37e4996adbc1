"""`ragrl index build` and `ragrl search`: build an index directory, query it from the shell."""
from __future__ import annotations

import json
import time
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from ragrl.paths import DEMO_CORPUS

index_app = typer.Typer(name="index", help="Build retrieval indexes.", no_args_is_help=True)


@index_app.command("build")
def build(
    out: Path = typer.Option(..., "--out", "-o", help="Index directory to create (an older index there is replaced)."),
    corpus: Path = typer.Option(DEMO_CORPUS, "--corpus", "-c", help="JSON Lines corpus (id, title, text), .gz ok.", show_default="bundled demo corpus"),
    kind: str = typer.Option("bm25", "--kind", help="bm25 | dense | hybrid"),
    encoder: str = typer.Option("all-minilm-l6-v2", "--encoder", help="Sentence-transformers model (dense, hybrid)."),
    hnsw: bool = typer.Option(False, "--hnsw", help="HNSW graph instead of exact flat search (dense, hybrid)."),
    batch_size: int = typer.Option(64, "--batch-size", help="Passages per encoder batch."),
    vectors: Path = typer.Option(None, "--vectors", help="Precomputed passage vectors (.npy, one row per corpus line) instead of encoding (dense, hybrid)."),
    dense: str = typer.Option(None, "--dense", help="flat (exact) | hnsw | ivf_sq8 (8-bit codes, 4x smaller) | ivf_pq (product codes, 32x smaller); IVF kinds are memory-mapped.", show_default="flat"),
    nlist: int = typer.Option(None, "--nlist", min=1, help="IVF lists (default ~4 sqrt(rows))."),
    pq_m: int = typer.Option(None, "--pq-m", min=1, help="ivf_pq: bytes per vector (must divide the dimension; default dim/8)."),
    rerank: int = typer.Option(None, "--rerank", min=0, help="IVF kinds: candidates per hit that the codes propose and the memory-mapped vectors re-score exactly (0: off).", show_default="ivf_pq 10, ivf_sq8 0"),
    recall_queries: int = typer.Option(1000, "--recall-queries", min=0, help="Approximate kinds: passage vectors used as queries to measure recall@10 against exact search (recorded in the manifest; 0: skip)."),
) -> None:
    """Build a bm25, dense or hybrid index of a corpus, a chunk of passages at a time (a killed build
    started again resumes after its last finished chunk)."""
    from ragrl.retrieval.index import build_index  # lazy: keeps `ragrl --help` fast

    start = time.perf_counter()
    path = build_index(corpus, out, kind=kind, encoder=encoder, hnsw=hnsw, dense_index=dense, nlist=nlist, pq_m=pq_m,
                       rerank=rerank, recall_queries=recall_queries, batch_size=batch_size, progress=True, vectors=vectors)
    seconds = time.perf_counter() - start
    manifest = json.loads((path / "manifest.json").read_text())
    rows, recall = manifest["rows"], manifest["params"].get("recall_at_10")
    typer.echo(f"indexed {rows} passages ({kind}) in {seconds:.1f} s, {rows / seconds:.0f} passages/s -> {path}")
    if recall:
        params = manifest["params"]
        how = [f"{recall['queries']} passage vectors as queries"]
        how += [f"nprobe {params['nprobe']}"] if params.get("nprobe") else []
        how += [f"re-ranking {params['rerank']} candidates a hit"] if params.get("rerank") else []
        typer.echo(f"recall@10 against exact search: {recall['recall']:.3f} ({', '.join(how)})")


@index_app.command("import")
def import_(
    faiss_file: Path = typer.Option(..., "--faiss", help="A faiss index file as Search-R1 / FlashRAG ship it (e.g. e5_Flat.index): row i is corpus line i."),
    corpus: Path = typer.Option(..., "--corpus", "-c", help="Its corpus (wiki-18 layout `id`, `contents`, or id/title/text); plain JSON Lines is read by offset, not loaded."),
    encoder: str = typer.Option(..., "--encoder", help="The encoder its vectors came from (e.g. intfloat/e5-base-v2, or a local path)."),
    out: Path = typer.Option(..., "--out", "-o", help="Index directory to create (it names the faiss file and corpus; neither is copied)."),
    query_prefix: str = typer.Option("", "--query-prefix", help='Put before every query: e5 wants "query: ".'),
    passage_prefix: str = typer.Option(None, "--passage-prefix", help='What the passages were encoded with (e5: "passage: "); default: try none and "passage: ".'),
    nprobe: int = typer.Option(None, "--nprobe", help="Cells an IVF index visits per query (faiss's default otherwise)."),
) -> None:
    """Search a faiss index file where it lies, after checking its rows, dimension, metric and vectors."""
    from ragrl.retrieval.faiss_import import import_faiss_index  # lazy: keeps `ragrl --help` fast

    path = import_faiss_index(faiss_file, corpus, out, encoder=encoder, query_prefix=query_prefix,
                              passage_prefix=passage_prefix, nprobe=nprobe)
    manifest = json.loads((path / "manifest.json").read_text())
    typer.echo(f"imported {manifest['rows']} vectors ({manifest['params']['faiss']['type']}, "
               f"{manifest['embedding_dim']}-d) -> {path}")


def search(
    query: str = typer.Argument(..., help="The query text."),
    index: Path = typer.Option(..., "--index", "-i", help="Index directory made by `ragrl index build`."),
    k: int = typer.Option(5, "-k", "--top-k", min=1, help="Number of hits."),
) -> None:
    """Print the top-k passages for a query."""

    from ragrl.retrieval.index import load_index  # late: keeps `ragrl --help` instant

    hits = load_index(index).search([query], k)[0]
    table = Table(title=f"{len(hits)} hits for {query!r}")
    for column in ("rank", "score", "id"):
        table.add_column(column, no_wrap=True)
    table.add_column("title", overflow="fold")
    table.add_column("text", overflow="fold")
    for rank, hit in enumerate(hits, start=1):
        snippet = hit.text if len(hit.text) <= 150 else hit.text[:150].rstrip() + "…"
        table.add_row(str(rank), f"{hit.score:.3f}", hit.id, hit.title, snippet)
    Console().print(table)


def register(app: typer.Typer) -> None:
    app.add_typer(index_app, name="index")
    app.command("search")(search)
