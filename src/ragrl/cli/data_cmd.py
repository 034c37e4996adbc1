"""`ragrl data`: what the data kit holds (files, rows, sources, licences), each file verified
against the kit's manifest. Exits non-zero, naming the files, when one is changed or missing."""
from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict

import typer

from ragrl.kit import inspect_kit


def _size(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 1e6 else f"{n / 1e3:.0f} kB"


def register(app: typer.Typer) -> None:
    @app.command()
    def data(
        sources: bool = typer.Option(False, "--sources", help="also list every upstream source file: repository, "
                                                              "commit, path and the licence it states"),
        as_json: bool = typer.Option(False, "--json", help="print the report as JSON"),
    ) -> None:
        """Report the installed data kit ($RAGRL_DATA, else the ragrl-data package) and verify its checksums."""
        report = inspect_kit()
        if as_json:
            typer.echo(json.dumps({"root": str(report.root), "origin": report.origin, "licence": report.licence,
                                   "intact": report.intact, "files": [asdict(f) for f in report.files],
                                   "sources": report.sources}, indent=1))
        else:
            typer.echo(f"data kit: {report.root} ({report.origin})")
            if report.licence:
                typer.echo(f"licence: {report.licence}")
            width = max(len(f.path) for f in report.files)
            repo_of = {s.get("key"): s.get("repo", "?") for s in report.sources}
            for f in report.files:
                rows = f"{f.rows:,}" if f.rows is not None else "-"
                typer.echo(f"{f.status:<8} {f.path:<{width}} {rows:>7} rows {_size(f.bytes):>8}  {f.licence}")
                if f.sources:   # one line per file: its source repositories, with how many of their files
                    repos = Counter(repo_of.get(key, key) for key in f.sources)
                    shown = ", ".join(r if n == 1 else f"{r} ({n} files)" for r, n in repos.items())
                    typer.echo(f"{'':<9}from {shown}")
            if sources:
                for s in report.sources:
                    typer.echo(f"source {s.get('key')}: {s.get('repo')}@{str(s.get('commit'))[:10]} {s.get('path')} "
                               f"({s.get('licence_stated_by_repo', s.get('license_stated_by_repo', '?'))})")
            ok = sum(f.status == "ok" for f in report.files)
            total = sum(f.bytes for f in report.files)
            typer.echo(f"{ok} of {len(report.files)} files verified by sha256 ({_size(total)}); "
                       f"{len(report.sources)} upstream sources (--sources lists them)")
        report.check()   # printed first: a damaged file is shown in the table, then named in the error
