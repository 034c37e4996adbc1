"""Run directory: durable metrics.jsonl (torn lines, truncation on resume), TensorBoard, config,
file logging, and refusing to overwrite a run."""
import logging

import pytest
import torch
import yaml
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from ragrl.errors import RagrlError
from ragrl.train.checkpoint import save_checkpoint
from ragrl.train.run_dir import (MetricsLogger, describe_machine, prepare_run_dir, read_metrics, read_training_record,
                                 record_stage, setup_file_logging,
                                 write_resolved_config)


def tb_scalars(run_dir, tag):
    acc = EventAccumulator(str(run_dir / "tb"))
    acc.Reload()
    return {e.step: e.value for e in acc.Scalars(tag)}


def test_metrics_jsonl_and_tensorboard(tmp_path):
    with MetricsLogger(tmp_path) as logger:
        for step in range(1, 4):
            logger.log(step, {"loss": 1.0 / step, "reward/em": torch.tensor(0.25 * step)})
    rows = read_metrics(tmp_path)
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert rows[1]["loss"] == 0.5 and rows[2]["reward/em"] == 0.75
    assert rows[0]["time"] <= rows[2]["time"]
    assert list((tmp_path / "tb").glob("events.out.tfevents.*"))
    assert tb_scalars(tmp_path, "reward/em") == {1: 0.25, 2: 0.5, 3: 0.75}


def test_bad_metric_values_are_rejected(tmp_path):
    with MetricsLogger(tmp_path, tensorboard=False) as logger:
        with pytest.raises(RagrlError, match="'answer' is not a number"):
            logger.log(1, {"answer": "paris"})
        with pytest.raises(RagrlError, match="reserved"):
            logger.log(1, {"step": 3.0})
    assert not (tmp_path / "tb").exists()


def test_torn_last_line_is_dropped_and_repaired(tmp_path):
    with MetricsLogger(tmp_path, tensorboard=False) as logger:
        logger.log(1, {"loss": 2.0})
        logger.log(2, {"loss": 1.5})
    # What a kill -9 in the middle of a write leaves behind.
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 3, "time": 1.0, "lo')
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2]
    # A new logger (the resumed run) must not glue its first line onto the torn one.
    with MetricsLogger(tmp_path, tensorboard=False) as logger:
        logger.log(3, {"loss": 1.0})
    assert [(r["step"], r["loss"]) for r in read_metrics(tmp_path)] == [(1, 2.0), (2, 1.5),
                                                                       (3, 1.0)]
    # A broken line in the middle is real corruption, reported with its line number.
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    lines[1] = "garbage"
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(RagrlError, match="line 2"):
        read_metrics(tmp_path)


def test_truncate_after_drops_replayed_steps_in_jsonl_and_tensorboard(tmp_path):
    with MetricsLogger(tmp_path) as logger:
        for step in range(1, 6):
            logger.log(step, {"loss": float(step)})
    # Resume from the step-3 checkpoint (steps 4 and 5 will be replayed), then die at once:
    # TensorBoard must already hide the stale steps 4 and 5.
    with MetricsLogger(tmp_path) as logger:
        logger.truncate_after(3)
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2, 3]
    assert tb_scalars(tmp_path, "loss") == {1: 1.0, 2: 2.0, 3: 3.0}
    with MetricsLogger(tmp_path) as logger:
        logger.truncate_after(3)
        for step in (4, 5):
            logger.log(step, {"loss": 10.0 * step})
    assert [(r["step"], r["loss"]) for r in read_metrics(tmp_path)] == [
        (1, 1.0), (2, 2.0), (3, 3.0), (4, 40.0), (5, 50.0)]
    assert tb_scalars(tmp_path, "loss") == {1: 1.0, 2: 2.0, 3: 3.0, 4: 40.0, 5: 50.0}
    assert not list(tmp_path.glob(".*.tmp"))


def test_a_resume_removes_the_temporaries_of_writes_a_kill_interrupted(tmp_path):
    out = tmp_path / "run"
    (out / ".tmp_best_adapter").mkdir(parents=True)
    (out / ".tmp_best_adapter" / "adapter_model.safetensors").write_bytes(b"half")
    (out / "best.tmp").write_text("{")
    (out / ".training.json.tmp").write_text("{")
    (out / "best_adapter").mkdir()
    (out / "best.json").write_text("{}")
    prepare_run_dir(out, resume=False)   # a fresh start in an empty-of-checkpoints dir touches nothing
    assert (out / "best.tmp").exists()
    prepare_run_dir(out, resume=True)
    assert sorted(p.name for p in out.iterdir()) == ["best.json", "best_adapter"]


def test_prepare_run_dir_refuses_to_overwrite_a_run(tmp_path):
    out = tmp_path / "runs" / "a"
    assert prepare_run_dir(out, resume=False) == out and out.is_dir()
    assert prepare_run_dir(out, resume=False) == out  # empty dir: fine to start in
    save_checkpoint(out, 1, model=torch.nn.Linear(2, 2))
    with pytest.raises(RagrlError, match="already has checkpoints; pass --resume"):
        prepare_run_dir(out, resume=False)
    assert prepare_run_dir(out, resume=True) == out
    (tmp_path / "file").write_text("x")
    with pytest.raises(RagrlError, match="not a directory"):
        prepare_run_dir(tmp_path / "file", resume=True)


def test_resolved_config_and_file_logging(tmp_path):
    cfg = {"model": {"name": "tiny", "lora": True}, "algo": {"estimator": "grpo", "kl": 0.0},
           "seed": 1}
    path = write_resolved_config(tmp_path, cfg)
    assert yaml.safe_load(path.read_text()) == cfg
    assert path.read_text().index("model:") < path.read_text().index("algo:")  # order kept

    handler = setup_file_logging(tmp_path)
    try:
        assert setup_file_logging(tmp_path) is handler  # idempotent
        logging.getLogger("ragrl.train.somewhere").info("step %d done", 7)
        handler.flush()
        text = (tmp_path / "train.log").read_text()
        assert text.count("step 7 done") == 1 and "INFO ragrl.train.somewhere" in text
    finally:
        logging.getLogger("ragrl").removeHandler(handler)
        handler.close()


def test_training_record_appends_each_stage_with_its_machine(tmp_path):
    assert read_training_record(tmp_path) is None
    record_stage(tmp_path, "sft", 61.24)
    record_stage(tmp_path, "rl", 300.0)
    record_stage(tmp_path, "rl", 12.5)        # a resumed stage adds its own entry
    stages = read_training_record(tmp_path)["stages"]
    assert [(s["stage"], s["seconds"]) for s in stages] == [("sft", 61.2), ("rl", 300.0), ("rl", 12.5)]
    assert all(s["machine"] == describe_machine() and s["date"] for s in stages)
    assert "cores" in describe_machine() or "x " in describe_machine()   # a CPU with its cores, or n x a GPU
    (tmp_path / "training.json").write_text("{not json")
    with pytest.raises(RagrlError, match="training.json is not valid JSON"):
        read_training_record(tmp_path)
