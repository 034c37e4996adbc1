"""`ragrl compare` end to end over real tiny runs (one RL step each on the tiny model, real BM25 and
dense indexes): every column, each run's start, a refused corpus, reuse, the viewer page, the CLI."""
from __future__ import annotations

import gzip
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ragrl.cli.main import app
from ragrl.compare.comparison import run_comparison
from ragrl.errors import ConfigError
from ragrl.eval.viewer import collect
from ragrl.train.recipe import load_train_config, run_recipe
from tests.train.test_recipe import one_step_overrides


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_model_dir, demo_bm25_dir, small_dense_dir):
    """Three finished one-step runs: an LM agent and a pipeline (SFT, then RL, on the demo BM25 index)
    and a retriever (HARR, on a dense index over a small corpus of its own). The agent's answers are
    written by its start (`rollout.answer_by: start`), so its evaluation loads the start beside it."""
    root = tmp_path_factory.mktemp("compare-runs")
    out = {}
    for name in ("search_r1_grpo", "mmoa_mappo", "harr_grpo"):
        base = load_train_config(name, [], "tiny")
        sets = one_step_overrides(base, root / name, tiny_model_dir, demo_bm25_dir, small_dense_dir)
        sets += ["rollout.answer_by=start"] if name == "search_r1_grpo" else []
        out[name] = run_recipe(load_train_config(name, sets, "tiny"))
    return out


def test_two_tiny_runs_give_every_column(runs, tmp_path, tiny_model_dir, demo_bm25_dir, caplog):
    out = tmp_path / "cmp"
    table = run_comparison([runs["search_r1_grpo"], runs["mmoa_mappo"]], data=["demo-eval"], n=4, out=out,
                           index=str(demo_bm25_dir), reader=str(tiny_model_dir), batch_size=4)
    names = ["direct", "naive_rag", "search_r1_grpo (start)", "search_r1_grpo", "mmoa_mappo (start)", "mmoa_mappo"]
    assert list(table["rows"]) == names
    for name, row in table["rows"].items():
        assert row["n"] == 4
        for key in ("em", "f1", "cover_em", "answer_shown", "searches", "tokens"):
            assert {"mean", "ci_lo", "ci_hi"} <= set(row[key]), (name, key)
        assert row["seconds_per_q"] > 0 and row["tokens"]["mean"] > 0
    rows = table["rows"]
    assert rows["direct"]["searches"]["mean"] == 0 and rows["naive_rag"]["searches"]["mean"] == 1
    # a pipeline's tokens are every agent's: rewriter, selector and generator each generate
    assert rows["mmoa_mappo"]["tokens"]["mean"] > rows["direct"]["tokens"]["mean"]
    assert rows["mmoa_mappo"]["searches"]["mean"] >= 1
    assert "selector_f1" in rows["mmoa_mappo"]["method_metrics"] and rows["search_r1_grpo"]["method_metrics"] == {}
    assert set(table["vs_start"]) == {"search_r1_grpo", "mmoa_mappo"}
    assert set(table["vs_baseline"]) == set(names) - {"naive_rag"}
    for run in ("search_r1_grpo", "mmoa_mappo"):   # SFT and RL, each timed on this machine
        trained = rows[run]["trained"]
        assert trained["seconds"] > 0 and "sft" in trained["how"] and "rl" in trained["how"]
        assert trained["machine"]
    md = (out / "compare.md").read_text()
    assert "| search_r1_grpo (start) | search_r1 |" in md and "## Searches that paid off" in md
    # how each system's episodes ended: every episode counted once; a baseline always answers
    assert all(sum(r["stop_reasons"].values()) == 4 for r in rows.values())
    assert rows["naive_rag"]["stop_reasons"] == {"answer": 4} and "## How episodes ended" in md
    assert (out / "f1_vs_searches.png").stat().st_size > 10_000
    saved = json.loads((out / "compare.json").read_text())
    assert saved["rows"]["naive_rag"]["f1"] == table["rows"]["naive_rag"]["f1"]
    page = collect(out)      # `ragrl view OUT`: every system, every question, the gold passages
    assert set(page["systems"]) == {n.replace(" (start)", "_start") for n in names}
    assert all(len(v) == 4 for v in page["systems"].values()) and page["gold_ids"]

    # the agent's answers came from its start: loaded beside the trained adapter; its start answers itself
    keys = {m["name"]: m["key"] for m in map(json.loads, map(Path.read_text, (out / "systems").glob("*.json")))}
    assert keys["search_r1_grpo"]["rollout"]["answer_by"] == "start"
    # answering itself is the default, which a key leaves out (`evaluation_key`: entries written before
    # answer_by existed stay valid)
    assert "answer_by" not in keys["search_r1_grpo (start)"]["rollout"]
    assert (runs["search_r1_grpo"] / "final_adapter" / "reference" / "adapter_config.json").is_file()

    # a second comparison with the same settings reruns nothing (a killed one resumes the same way)
    again = run_comparison([runs["search_r1_grpo"], runs["mmoa_mappo"]], data=["demo-eval"], n=4, out=out,
                           index=str(demo_bm25_dir), reader=str(tiny_model_dir), batch_size=4)
    assert {r["reused"] for r in again["rows"].values()} == {"cached"}
    assert again["rows"]["mmoa_mappo"]["f1"] == table["rows"]["mmoa_mappo"]["f1"]
    # another comparison that reuses this one's systems (--cache-from) runs only what it adds: nothing here
    elsewhere = run_comparison([runs["search_r1_grpo"]], data=["demo-eval"], n=4, out=tmp_path / "other",
                               index=str(demo_bm25_dir), reader=str(tiny_model_dir), batch_size=4, cache_from=(out,))
    assert {r["reused"] for r in elsewhere["rows"].values()} == {"cached"}
    assert elsewhere["rows"]["search_r1_grpo"]["f1"] == table["rows"]["search_r1_grpo"]["f1"]
    # entries committed gzipped (<digest>.jsonl.gz beside the record) are unpacked and reused the same way;
    # one whose rows were altered fails its checksum, and one that is not gzip at all is said in the log:
    # both are evaluated again
    packed = tmp_path / "packed" / "systems"
    packed.mkdir(parents=True)
    for record in (out / "systems").glob("*.json"):
        shutil.copyfile(record, packed / record.name)
        rows, name = record.with_suffix(".jsonl").read_bytes(), json.loads(record.read_text())["name"]
        with gzip.open(packed / f"{record.stem}.jsonl.gz", "wb") as f:
            f.write(rows.replace(b'"f1"', b'"F1"', 1) if name == "naive_rag" else rows)
        if name == "direct":   # plain bytes, not gzip
            (packed / f"{record.stem}.jsonl.gz").write_bytes(rows[:100])
    with caplog.at_level(logging.WARNING, logger="ragrl"):
        unpacked = run_comparison([runs["search_r1_grpo"]], data=["demo-eval"], n=4, out=tmp_path / "unpacked",
                                  index=str(demo_bm25_dir), reader=str(tiny_model_dir), batch_size=4,
                                  cache_from=(tmp_path / "packed",))
    assert {n: r["reused"] for n, r in unpacked["rows"].items()} == {
        "direct": None, "naive_rag": None, "search_r1_grpo (start)": "cached", "search_r1_grpo": "cached"}
    assert "is damaged" in caplog.text and "that system is evaluated again" in caplog.text
    assert unpacked["rows"]["search_r1_grpo"]["f1"] == table["rows"]["search_r1_grpo"]["f1"]
    with pytest.raises(ConfigError, match="--cache-from: .*nowhere/systems is not there"):
        run_comparison([runs["search_r1_grpo"]], data=["demo-eval"], n=4, out=tmp_path / "third",
                       index=str(demo_bm25_dir), reader=str(tiny_model_dir), cache_from=(tmp_path / "nowhere",))


def test_a_run_on_another_corpus_is_refused_then_compared_when_allowed(runs, tmp_path, tiny_model_dir, demo_bm25_dir):
    with pytest.raises(ConfigError) as error:
        run_comparison([runs["harr_grpo"]], data=["demo-eval"], n=2, out=tmp_path / "no",
                       index=str(demo_bm25_dir), reader=str(tiny_model_dir))
    assert "harr_grpo" in str(error.value) and "corpus.jsonl" in str(error.value) and "corpus.jsonl.gz" in str(error.value)
    assert not (tmp_path / "no").exists()           # refused before any work
    table = run_comparison([runs["harr_grpo"]], data=["demo-eval"], n=3, out=tmp_path / "yes", index=str(demo_bm25_dir),
                           reader=str(tiny_model_dir), allow_mismatch=True, with_start=True)
    harr = table["rows"]["harr_grpo"]
    # the trained encoder searches two hops of 3 (its recipe), and the reader answers from all six
    assert harr["searches"]["mean"] == 2 and harr["method"] == "harr" and harr["index"]
    assert table["vs_start"]["harr_grpo"]["n_paired"] == 3


def test_questions_a_run_trained_on_are_refused(runs, tmp_path, tiny_model_dir, demo_bm25_dir):
    with pytest.raises(ConfigError, match="training data"):
        run_comparison([runs["search_r1_grpo"]], data=["demo-train"], n=3, out=tmp_path / "c",
                       index=str(demo_bm25_dir), reader=str(tiny_model_dir))


def test_cli_trains_a_recipe_then_compares(tmp_path, tiny_model_dir, demo_bm25_dir, small_dense_dir):
    out = tmp_path / "cmp"
    base = load_train_config("search_r1_grpo", [], "tiny")
    sets = [s for s in one_step_overrides(base, tmp_path / "unused", tiny_model_dir, demo_bm25_dir, small_dense_dir)
            if not s.startswith("out_dir=")]
    args = ["compare", "--train", "search_r1_grpo", "--minutes", "1", "--data", "demo-eval", "--n", "2",
            "--index", str(demo_bm25_dir), "--reader", str(tiny_model_dir), "--device", "cpu", "--out", str(out)]
    args += [x for s in sets for x in ("--set", s)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert (out / "runs" / "search_r1_grpo" / "final_adapter").is_dir()
    assert "search_r1_grpo (start)" in result.output and "naive_rag" in result.output
    mtime = (out / "runs" / "search_r1_grpo" / "final_adapter").stat().st_mtime
    again = CliRunner().invoke(app, args)             # finished: not trained again
    assert again.exit_code == 0, again.output
    assert (out / "runs" / "search_r1_grpo" / "final_adapter").stat().st_mtime == mtime


def test_cli_asks_for_questions(tmp_path):
    result = CliRunner().invoke(app, ["compare", str(tmp_path), "--out", str(tmp_path / "o")])
    assert result.exit_code != 0 and "--data" in result.output


def without_wall_time(table: dict) -> dict:
    """The comparison's figures, its wall-time and reuse readings aside."""
    return {name: {k: v for k, v in row.items() if k not in ("seconds_per_q", "reused", "trained")}
            for name, row in table["rows"].items()}


def test_a_killed_comparison_resumes_to_the_same_table_and_a_damaged_cache_entry_is_recomputed(
        runs, tmp_path, tiny_model_dir, demo_bm25_dir, caplog):
    run, args = runs["search_r1_grpo"], dict(data=["demo-eval"], n=4, index=str(demo_bm25_dir),
                                             reader=str(tiny_model_dir), batch_size=4)
    whole = run_comparison([run], out=tmp_path / "whole", **args)

    # `ragrl compare` in its own process, SIGKILLed once its first system is cached
    out = tmp_path / "killed"
    cmd = [sys.executable, "-m", "ragrl.cli.main", "compare", str(run), "--data", "demo-eval", "--n", "4",
           "--index", str(demo_bm25_dir), "--reader", str(tiny_model_dir), "--batch-size", "4", "--out", str(out)]
    proc = subprocess.Popen(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.monotonic() + 240
    while not list((out / "systems").glob("*.json")):
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
        assert time.monotonic() < deadline, "the comparison cached nothing in time"
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    assert not (out / "compare.json").exists()   # it was killed before its table
    resumed = run_comparison([run], out=out, **args)
    assert without_wall_time(resumed) == without_wall_time(whole)
    reuse = [row["reused"] for row in resumed["rows"].values()]
    assert "cached" in reuse and None in reuse   # what was done stays done; the rest is run

    # one byte of a cached system's trajectories flipped: detected, said, recomputed, same table
    stored = sorted((out / "systems").glob("*.jsonl"))[0]
    data = bytearray(stored.read_bytes())
    data[len(data) // 2] ^= 0x01
    stored.write_bytes(bytes(data))
    (sorted((out / "systems").glob("*.json"))[-1]).write_text('{"name": "cut sh')   # another's record cut short
    with caplog.at_level(logging.WARNING, logger="ragrl"):
        again = run_comparison([run], out=out, **args)
    said = caplog.text
    assert f"{stored.name} changed after it was written (sha256 mismatch); evaluating it again" in said
    assert "its record is not JSON" in said
    assert without_wall_time(again) == without_wall_time(whole)
    assert sorted(row["reused"] is None for row in again["rows"].values()) == [False, False, True, True]


class _Killed(Exception):
    """The fault injected: the comparison dies in the middle of a system."""


@pytest.mark.parametrize("damage", [False, True])
def test_a_comparison_killed_within_a_system_resumes_from_its_last_finished_batch(
        runs, tmp_path, tiny_model_dir, demo_bm25_dir, monkeypatch, caplog, damage):
    import ragrl.compare.systems as systems

    args = dict(data=["demo-eval"], n=4, index=str(demo_bm25_dir), reader=str(tiny_model_dir), batch_size=2)
    chosen = [runs["search_r1_grpo"], runs["mmoa_mappo"]]
    whole = run_comparison(chosen, out=tmp_path / "whole", **args)
    real, calls = systems.run_agent, []

    def counted(*a, die_at=None, **kw):
        calls.append(len(a[3]))
        if len(calls) == die_at:
            raise _Killed
        return real(*a, **kw)

    # Batches of 2 of 4 questions: the agent's start (calls 1-2), then the agent: its first batch is
    # kept, and the comparison dies in its second.
    out = tmp_path / "cmp"
    monkeypatch.setattr(systems, "run_agent", lambda *a, **kw: counted(*a, die_at=4, **kw))
    with pytest.raises(_Killed):
        run_comparison(chosen, out=out, **args)
    kept = sorted((out / "systems").glob("*.partial/*.jsonl"))
    assert [p.name for p in kept] == ["000000-000002.jsonl"]
    if damage:
        data = bytearray(kept[0].read_bytes())
        data[len(data) // 2] ^= 0x01
        kept[0].write_bytes(bytes(data))

    calls.clear()
    monkeypatch.setattr(systems, "run_agent", lambda *a, **kw: counted(*a, **kw))
    with caplog.at_level(logging.WARNING, logger="ragrl"):
        resumed = run_comparison(chosen, out=out, **args)
    # the agent's kept batch is read back, not run again (unless damaged); the pipeline runs whole
    assert calls == ([2, 2] if damage else [2]) + [2, 2, 2, 2]
    assert ("kept batch" in caplog.text and "sha256 mismatch" in caplog.text) == damage
    assert without_wall_time(resumed) == without_wall_time(whole)
    assert not list((out / "systems").glob("*.partial"))   # whole entries replace the batches


def test_bfloat16_weights_are_systems_of_their_own_and_a_bad_precision_is_refused(runs, tmp_path, tiny_model_dir,
                                                                                   demo_bm25_dir):
    args = dict(data=["demo-eval"], n=2, index=str(demo_bm25_dir), reader=str(tiny_model_dir), batch_size=2,
                with_start=False)
    f32 = tmp_path / "f32"
    run_comparison([runs["search_r1_grpo"]], out=f32, **args)
    b16 = run_comparison([runs["search_r1_grpo"]], out=tmp_path / "b16", cache_from=(f32,), dtype="bfloat16", **args)
    assert not any(row["reused"] for row in b16["rows"].values())   # float32's answers are not bfloat16's
    assert b16["meta"]["weights"] == "bfloat16"

    def keys(folder):
        return [json.loads(p.read_text())["key"] for p in (folder / "systems").glob("*.json")]
    # every system has a bfloat16 entry of its own beside the float32 ones --cache-from seeded
    assert sum(k.get("dtype") == "bfloat16" for k in keys(tmp_path / "b16")) == len(b16["rows"]) == 3
    assert all("dtype" not in k for k in keys(f32))     # float32 keys are as before: earlier caches stay valid
    with pytest.raises(ConfigError, match="--dtype must be one of float32, bfloat16; got 'float16'"):
        run_comparison([runs["search_r1_grpo"]], out=tmp_path / "never", dtype="float16", **args)
    assert not (tmp_path / "never").exists()            # refused before any work


def test_a_run_whose_start_writes_its_answers_is_refused_without_that_start(runs, tmp_path, tiny_model_dir,
                                                                            demo_bm25_dir):
    """`rollout.answer_by: start` with the frozen start missing from the adapter folder (a run copied in
    part): refused before any work, naming the folder, since the base model would answer instead."""
    import shutil

    copy = tmp_path / "search_r1_grpo"
    shutil.copytree(runs["search_r1_grpo"], copy)
    shutil.rmtree(copy / "final_adapter" / "reference")
    with pytest.raises(ConfigError, match=r"final_adapter holds no frozen start \(reference/"):
        run_comparison([copy], data=["demo-eval"], n=2, out=tmp_path / "never", index=str(demo_bm25_dir),
                       reader=str(tiny_model_dir))
    assert not (tmp_path / "never").exists()


@pytest.mark.parametrize("writer", ["base", "reader"])
def test_a_run_read_by_the_base_keeps_its_and_its_starts_adapters_unmerged(runs, tmp_path, tiny_model_dir,
                                                                          demo_bm25_dir, writer):
    """`rollout.answer_by: base` (or `reader`): the trained run and its start are both read by the base
    model, so both are loaded with their adapter unmerged (a merged one could not be switched off, and
    is refused when the episodes start), and both keys name the writer, so neither reuses answers the
    start wrote itself."""
    import shutil

    copy = tmp_path / "search_r1_grpo"
    shutil.copytree(runs["search_r1_grpo"], copy)
    config = (copy / "config.yaml").read_text()
    assert "answer_by: start" in config
    (copy / "config.yaml").write_text(config.replace("answer_by: start", f"answer_by: {writer}"))
    out = tmp_path / "cmp"
    table = run_comparison([copy], data=["demo-eval"], n=2, out=out, index=str(demo_bm25_dir),
                           reader=str(tiny_model_dir), batch_size=2)
    assert set(table["rows"]) == {"direct", "naive_rag", "search_r1_grpo (start)", "search_r1_grpo"}
    keys = {m["name"]: m["key"] for m in map(json.loads, map(Path.read_text, (out / "systems").glob("*.json")))}
    assert keys["search_r1_grpo"]["rollout"]["answer_by"] == writer
    assert keys["search_r1_grpo (start)"]["rollout"]["answer_by"] == writer
