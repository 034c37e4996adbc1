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
) -> None:
    """Build a bm25, dense or hybrid index of a corpus."""
    from ragrl.retrieval.index import build_index  # lazy: keeps `ragrl --help` fast

    start = time.perf_counter()
    path = build_index(corpus, out, kind=kind, encoder=encoder, hnsw=hnsw, batch_size=batch_size, progress=True,
                       vectors=vectors)
    seconds = time.perf_counter() - start
    rows = json.loads((path / "manifest.json").read_text())["rows"]
    typer.echo(f"indexed {rows} passages ({kind}) in {seconds:.1f} s, {rows / seconds:.0f} passages/s -> {path}")


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
