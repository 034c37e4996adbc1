"""Reading a run for a comparison: refusals that name the difference, held-out questions, training time."""
from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from ragrl.compare.runs import (
    RunRecord,
    SearchSetting,
    check_comparable,
    check_held_out,
    read_run,
    training_time,
)
from ragrl.datasets import load_questions
from ragrl.errors import ConfigError, RagrlError
from ragrl.train.config import TrainConfig
from ragrl.train.recipe import load_train_config
from ragrl.train.run_dir import write_resolved_config


def _run(search: SearchSetting, evaluation: str = "agent", label: str = "r") -> RunRecord:
    return RunRecord(Path(label), label, TrainConfig(), None, evaluation, Path("t"), None, search)


DEMO = SearchSetting(Path("demo.jsonl.gz"), "aaaaaaaaaaaaaaaa", "bm25", "bm25(demo.jsonl.gz)")
WIKI = SearchSetting(Path("wiki_passages.jsonl.gz"), "bbbbbbbbbbbbbbbb", "bm25", "bm25(wiki_passages.jsonl.gz)")


def test_another_corpus_is_refused_naming_both():
    with pytest.raises(ConfigError) as error:
        check_comparable(_run(DEMO, label="search_r1_demo"), WIKI)
    message = str(error.value)
    assert "search_r1_demo" in message and "demo.jsonl.gz" in message and "wiki_passages.jsonl.gz" in message
    assert "--allow-mismatch" in message
    check_comparable(_run(DEMO), WIKI, allow_mismatch=True)       # told otherwise: accepted


def test_another_index_kind_is_refused_for_an_agent_but_a_retriever_brings_its_own():
    dense = SearchSetting(WIKI.corpus, WIKI.corpus_sha256, "dense", "runs/dense_index")
    with pytest.raises(ConfigError, match="dense index .*runs/dense_index.* bm25"):
        check_comparable(_run(dense), WIKI)
    check_comparable(_run(dense, evaluation="retriever"), WIKI)   # its index is its policy's
    server = SearchSetting(WIKI.corpus, "", "server", "http://localhost:8000")
    with pytest.raises(ConfigError, match="retrieval server .*http://localhost:8000"):
        check_comparable(_run(server), WIKI)


def test_a_question_the_run_trained_on_is_refused():
    run = _run(DEMO)
    run.cfg.data.train = "demo-train"
    seen = load_questions("demo-train", limit=3)
    with pytest.raises(ConfigError, match=r"3 of the comparison's questions are in r's training data \(demo-train\)"):
        check_held_out(run, seen + load_questions("demo-eval", limit=2))
    check_held_out(run, load_questions("demo-eval", limit=20))


def test_a_folder_that_is_not_a_finished_run_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="no config.yaml"):
        read_run(tmp_path)


def test_training_time_adds_the_stages_and_an_earlier_stage_run(tmp_path):
    stage1, stage2 = tmp_path / "stage1", tmp_path / "stage2"
    for d, stages in ((stage1, [("sft", 120.0), ("rl", 300.0)]), (stage2, [("rl", 240.0), ("rl", 60.0)])):
        stand_in_adapter(d / "final_adapter")
        (d / "config.yaml").write_text("{}\n")
        (d / "training.json").write_text(json.dumps({"stages": [
            {"stage": s, "seconds": sec, "machine": "CPU: test, 2 cores", "date": "2026-11-27"} for s, sec in stages]}))
    cfg = TrainConfig()
    cfg.model.init_adapter = str(stage1 / "final_adapter")
    # its start (where its RL began) is stage 1's SFT adapter; its training time counts stage 1 whole
    run = RunRecord(stage2, "stage2", cfg, None, "agent", stage2 / "final_adapter", stage1 / "sft" / "adapter", DEMO)
    t = training_time(run)
    assert t["seconds"] == 120 + 300 + 240 + 60
    assert t["machine"] == "CPU: test, 2 cores"
    assert "after stage1" in t["how"] and "rl 4.0 min + rl 1.0 min" in t["how"]


def test_a_run_started_from_another_run_sft_adapter_adds_that_sft_stage_alone(tmp_path):
    """Search-R1's learn candidates B-E start from A's warm start (runs/learn_a/sft/adapter): A's RL is
    not part of their training, its SFT is."""
    a, b = tmp_path / "learn_a", tmp_path / "learn_b"
    for d, stages in ((a, [("sft", 630.0), ("rl", 3864.0)]), (b, [("rl", 2454.0)])):
        (d / "sft" / "adapter").mkdir(parents=True)
        (d / "config.yaml").write_text("{}\n")
        (d / "training.json").write_text(json.dumps({"stages": [
            {"stage": s, "seconds": sec, "machine": "CPU: test, 2 cores", "date": "2026-11-28"} for s, sec in stages]}))
    cfg = TrainConfig()
    cfg.model.init_adapter = str(a / "sft" / "adapter")
    t = training_time(RunRecord(b, "learn_b", cfg, None, "agent", b / "final_adapter", a / "sft" / "adapter", DEMO))
    assert t["seconds"] == 2454 + 630
    assert "after learn_a (its SFT stage) (sft 10.5 min)" in t["how"]


def test_training_time_falls_back_to_the_rl_steps(tmp_path):
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps({"step": i, "time/step_s": 2.5}) + "\n" for i in range(4)))
    t = training_time(RunRecord(tmp_path, "r", TrainConfig(), None, "agent", tmp_path, None, DEMO))
    assert t["seconds"] == 10.0 and "RL steps only" in t["how"]


def stand_in_adapter(folder: Path) -> None:
    """An adapter folder whose files pass the run reader's checks (one real safetensors file)."""
    folder.mkdir(parents=True)
    save_file({"w": torch.zeros(64, 64)}, str(folder / "adapter_model.safetensors"))
    (folder / "adapter_config.json").write_text("{}")


def finished_run(tmp_path: Path) -> Path:
    """A run folder as `ragrl train` leaves it, with a stand-in adapter."""
    run = tmp_path / "run"
    stand_in_adapter(run / "final_adapter")
    cfg = load_train_config("search_r1_grpo", [f"out_dir={run}", "model.init_adapter=null"], "tiny")
    write_resolved_config(run, asdict(cfg))
    return run


def test_a_run_folder_cut_short_is_refused_naming_the_file(tmp_path):
    run = finished_run(tmp_path)
    assert read_run(run).trained == run / "final_adapter"   # whole: it reads
    config = run / "config.yaml"
    text = config.read_text()
    config.write_text(text[: len(text) // 2])               # a copy cut short: the later settings gone
    with pytest.raises(RagrlError, match=r"config.yaml is cut short: it does not end with '# end of resolved config'"):
        read_run(run)
    config.write_text(text.split("\n", 1)[1])               # no head line: an older ragrl's file, read as is
    assert read_run(run).cfg.steps == 40

    weights = run / "final_adapter" / "adapter_model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) - 100])             # the weights cut short
    with pytest.raises(ConfigError, match=r"final_adapter/adapter_model.safetensors is damaged"):
        read_run(run)
    weights.write_bytes(data)
    (run / "final_adapter" / "adapter_config.json").unlink()
    with pytest.raises(ConfigError, match=r"final_adapter/adapter_config.json is missing"):
        read_run(run)
    weights.unlink()
    with pytest.raises(ConfigError, match=r"final_adapter holds no .safetensors weights"):
        read_run(run)


def test_a_later_stage_is_paired_against_the_start_of_the_first(tmp_path):
    """R1-Searcher's stage 2 starts from stage 1's final_adapter: its start is where stage 1's RL began
    (stage 1's SFT adapter), not stage 1's end; a plain adapter folder stays the start; a loop is refused."""
    stage1 = tmp_path / "stage1"
    stand_in_adapter(stage1 / "final_adapter")
    stand_in_adapter(stage1 / "sft" / "adapter")
    cfg1 = load_train_config("r1_searcher_stage1", [f"out_dir={stage1}",
                                                    f"model.init_adapter={stage1 / 'sft' / 'adapter'}"], "tiny")
    write_resolved_config(stage1, asdict(cfg1))
    stage2 = tmp_path / "stage2"
    stand_in_adapter(stage2 / "final_adapter")
    cfg2 = load_train_config("r1_searcher_stage2", [f"out_dir={stage2}",
                                                    f"model.init_adapter={stage1 / 'final_adapter'}"], "tiny")
    write_resolved_config(stage2, asdict(cfg2))
    assert read_run(stage1).start == stage1 / "sft" / "adapter"
    assert read_run(stage2).start == stage1 / "sft" / "adapter"

    cfg1.model.init_adapter = str(stage2 / "final_adapter")      # stage 1 now claims to start from stage 2
    write_resolved_config(stage1, asdict(cfg1))
    with pytest.raises(ConfigError, match="form a loop"):
        read_run(stage2)
