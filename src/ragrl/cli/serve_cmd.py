"""`ragrl serve`: serve an index over HTTP in Search-R1's /retrieve format."""
from __future__ import annotations

import logging
import sys
from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    @app.command("serve")
    def serve_command(
        index: Path = typer.Option(..., "--index", help="Index directory built by `ragrl index build`."),
        host: str = typer.Option("127.0.0.1", help="Interface to listen on (0.0.0.0 exposes it to the network)."),
        port: int = typer.Option(8000, help="TCP port; 0 picks a free one (the printed URL shows it)."),
        token: str = typer.Option(None, envvar="RAGRL_SERVER_TOKEN",
                                  help="Require 'Authorization: Bearer TOKEN' on /retrieve."),
        default_topk: int = typer.Option(3, help="topk when a request gives none (Search-R1 default: 3)."),
        max_topk: int = typer.Option(100, help="Largest topk a request may ask for."),
        max_queries: int = typer.Option(256, help="Most queries in one request."),
        max_query_chars: int = typer.Option(2048, help="Longest query, in characters."),
        max_body_bytes: int = typer.Option(1_000_000, help="Largest request body, in bytes."),
        max_wait_ms: float = typer.Option(2.0, help="How long a request waits to be batched with others."),
        verbose: bool = typer.Option(False, "--verbose", "-v", help="Log one line per request."),
    ) -> None:
        """Serve INDEX at http://HOST:PORT/retrieve (Search-R1 compatible) and /health."""
        from ragrl.retrieval.server import serve  # late: training never loads the web stack (fastapi, uvicorn)

        if verbose:
            logging.getLogger("ragrl.retrieval.server").setLevel(logging.DEBUG)

        def ready(url: str) -> None:
            typer.echo(f"ragrl retrieval server ready at {url}  (POST {url}/retrieve, GET {url}/health)")

            sys.stdout.flush()  # tests and scripts wait for this line on a pipe

        serve(
            index, host=host, port=port, on_ready=ready, token=token, default_topk=default_topk,
            max_topk=max_topk, max_queries_per_request=max_queries, max_query_chars=max_query_chars,
            max_body_bytes=max_body_bytes, max_wait_ms=max_wait_ms,
        )
