"""`ragrl compare`: every trained run, its start and the baselines on the same questions, corpus,
index and reader, in one table.

    table = run_comparison([Path("runs/a"), Path("runs/b")], data=["kit:eval/hotpotqa_dev.jsonl.gz"],
                           n=200, out=Path("runs/compare"))

Writes into `out`: compare.md and compare.json (the table, ragrl.compare.table), f1_vs_searches.png,
trajectories_<system>.jsonl and report.json (what `ragrl view OUT` reads: every system side by side on
each question), questions.jsonl (the questions, with their gold passages), and systems/ (each
distinct system's trajectories, reused by a later comparison with the same settings; while a system
runs, its finished batches of questions, from which a killed comparison resumes).
Everything that can be refused (a run that is not finished, another corpus or index, a question a
run trained on, duplicate question ids) is refused before any model is loaded.
"""
from __future__ import annotations

import datetime as _dt
import gzip
import json
import logging
import shutil
from pathlib import Path

from ragrl.compare.runs import (
    RunRecord,
    SearchSetting,
    check_comparable,
    check_held_out,
    corpus_setting,
    read_run,
    training_time,
)
from ragrl.compare.systems import Context, System, evaluate_systems, systems_for
from ragrl.compare.table import build_table, markdown
from ragrl.datasets import load_questions
from ragrl.errors import ConfigError
from ragrl.eval.plots import f1_vs_searches
from ragrl.eval.report import file_stem, write_trajectories
from ragrl.policy.lm_model import eval_dtype
from ragrl.retrieval.corpus import load_corpus
from ragrl.retrieval.resolve import retriever_for

log = logging.getLogger(__name__)

OUT_FILES = ("compare.md", "compare.json", "f1_vs_searches.png", "report.json", "questions.jsonl")


def load_comparison_questions(data: list[str], n: int | None) -> list[dict]:
    """The first `n` questions of each file, in file order; ids must be unique across the files."""
    if not data:
        raise ConfigError("--data: name at least one question file")
    rows: list[dict] = []
    for path in data:
        part = load_questions(path, limit=n)
        for q in part:
            q.setdefault("source", str(path))
        rows += part
    seen: dict[str, str] = {}
    for q in rows:
        qid = str(q["id"])
        if qid in seen:
            raise ConfigError(f"question id {qid!r} is in {seen[qid]} and again in {q['source']}: "
                              "the paired statistics need one id per question")
        seen[qid] = q["source"]
    return rows


def search_setting(runs: list[RunRecord], index: str | None, corpus: str | None
                   ) -> tuple[SearchSetting, str | None, str | None]:
    """The comparison's corpus and index: --index, else BM25 over --corpus, else the index folder the
    agent runs all searched (their data.index), else BM25 over the corpus the runs searched, which
    must then be one; returns the setting, the index and the corpus spec to build from."""
    if index is None and corpus is None:
        indexes = {r.cfg.data.index for r in runs if r.evaluation != "retriever"}
        if len(indexes) == 1 and None not in indexes:
            return corpus_setting(None, next(iter(indexes))), next(iter(indexes)), None
        specs = {r.cfg.data.corpus for r in runs}
        if len(specs) > 1:
            raise ConfigError(f"the runs searched different corpora ({', '.join(sorted(map(str, specs)))}); "
                              "name the comparison's with --corpus or --index")
        corpus = next(iter(specs)) if specs else None
    return corpus_setting(corpus, index), index, corpus


def seed_cache(cache: Path, sources: list[Path]) -> None:
    """Copy into `cache` each whole entry (record and trajectories) of `sources` that it lacks; the
    trajectories may be gzipped there (`<digest>.jsonl.gz`: entries committed to a repository), and are
    unpacked here. A copied entry is trusted only as every entry is: its key must be this comparison's
    system's, and its trajectories must match the checksum its record holds (`cached_entry`)."""
    cache.mkdir(parents=True, exist_ok=True)
    for source in sources:
        for record in sorted(source.glob("*.json")):
            rows, packed = record.with_suffix(".jsonl"), record.with_suffix(".jsonl.gz")
            if (cache / record.name).exists() or not (rows.is_file() or packed.is_file()):
                continue
            if rows.is_file():
                shutil.copyfile(rows, cache / rows.name)
            else:
                try:
                    with gzip.open(packed, "rb") as src, (cache / rows.name).open("wb") as dst:
                        shutil.copyfileobj(src, dst)
                except (OSError, EOFError) as e:   # not gzip, or cut short: the system is evaluated again
                    (cache / rows.name).unlink(missing_ok=True)
                    log.warning("--cache-from: %s is damaged (%s); that system is evaluated again", packed, e)
                    continue
            shutil.copyfile(record, cache / record.name)   # last, as evaluate_systems writes them


def run_comparison(run_dirs: list[Path], *, data: list[str], out: Path, n: int | None = None,
                   index: str | None = None, corpus: str | None = None, reader: str = "smollm2-135m-instruct",
                   topk: int = 3, batch_size: int = 32, seed: int = 0, allow_mismatch: bool = False,
                   with_start: bool = True, skip_start: frozenset[str] = frozenset(), device="cpu",
                   progress=None, cache_from: tuple[Path, ...] = (), dtype: str = "float32") -> dict:
    """Evaluate every run (and its start) and the baselines; write the table and files into `out`.
    `cache_from`: earlier comparisons' folders whose evaluated systems are reused where their keys match.
    `dtype`: the LM weights' precision while generating (float32, or bfloat16: faster where the
    hardware computes it natively, and greedy answers that can differ from float32's)."""
    eval_dtype(dtype)   # before any work
    sources = [Path(d) / "systems" for d in cache_from]
    if missing := [str(d) for d in sources if not d.is_dir()]:
        raise ConfigError(f"--cache-from: {', '.join(missing)} is not there: name a comparison's output folder")
    runs = [read_run(Path(p)) for p in run_dirs]
    labels = [r.label for r in runs]
    if len(set(labels)) != len(labels):
        raise ConfigError(f"two runs share a folder name ({labels}): rows are named after it; rename one")
    if any(label in ("direct", "naive_rag") for label in labels):
        raise ConfigError("a run folder may not be named direct or naive_rag (the baselines' rows)")
    unknown = sorted(set(skip_start) - set(labels))
    if unknown:
        raise ConfigError(f"--skip-start names no run of this comparison: {', '.join(unknown)} (runs: {', '.join(labels)})")
    samples = load_comparison_questions(data, n)
    setting, index, corpus = search_setting(runs, index, corpus)
    for run in runs:   # before any model is loaded
        check_comparable(run, setting, allow_mismatch=allow_mismatch)
        check_held_out(run, samples)
    passages = load_corpus(setting.corpus)
    ctx = Context(samples=samples, corpus=passages, retriever=retriever_for(index, corpus), setting=setting,
                  reader=reader, topk=topk, batch_size=batch_size, seed=seed, device=device, progress=progress,
                  dtype=dtype)
    systems = systems_for(runs, with_start=with_start, skip_start=frozenset(skip_start))
    out.mkdir(parents=True, exist_ok=True)
    seed_cache(out / "systems", sources)
    results = evaluate_systems(systems, ctx, out / "systems")
    costs = {r.label: r.method.retrieval_cost(r.cfg) for r in runs
             if r.method is not None and r.method.retrieval_cost is not None}
    table = build_table(results, systems, train_times={r.label: training_time(r) for r in runs}, costs=costs)
    meta = {"questions": f"{len(samples)}: " + ", ".join(f"{d} (first {n})" if n else str(d) for d in data),
            "corpus": f"{setting.corpus} ({len(passages)} passages, sha256 {setting.corpus_sha256[:12]})",
            "index": setting.index, "reader": reader, "naive_rag top k": topk, "decoding": "greedy",
            "weights": dtype, "seed": seed, "date": _dt.datetime.now().isoformat(timespec="seconds")}
    write_outputs(out, table, meta, results, systems, samples)
    return {**table, "meta": meta}


def write_outputs(out: Path, table: dict, meta: dict, results: dict, systems: list[System], samples: list[dict]) -> None:
    (out / "compare.json").write_text(json.dumps({"meta": meta, **table}, indent=1, default=str))
    (out / "compare.md").write_text(markdown(table, meta) + "\n![F1 against searches](f1_vs_searches.png)\n")
    f1_vs_searches(table["rows"], out / "f1_vs_searches.png")
    for old in out.glob("trajectories_*.jsonl"):   # an earlier comparison's systems would show in the viewer
        old.unlink()
    files = {}
    for sys in systems:
        files[sys.name] = write_trajectories(out / f"trajectories_{file_stem(sys.name)}.jsonl",
                                             results[sys.name]["trajectories"]).name
    with (out / "questions.jsonl").open("w", encoding="utf-8") as f:
        for q in samples:
            f.write(json.dumps(q, ensure_ascii=False) + "\n")
    # what `ragrl view OUT` reads: the question file (gold passages highlighted) and each system's file
    (out / "report.json").write_text(json.dumps({"meta": meta, "settings": {"data_file": str(out / "questions.jsonl")},
                                                 "files": files}, indent=1, default=str))
