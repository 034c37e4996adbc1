"""report_to: wandb (offline) and MLflow (a local file store) next to metrics.jsonl and TensorBoard, on
a tiny real training run, its --resume and the reports added after it; the check refuses a tracker
that is not installed, or named twice."""
from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from ragrl.errors import ConfigError
from ragrl.train.check import check_combinations
from ragrl.train.run_dir import MetricsLogger, read_metrics
from ragrl.train.trackers import report_files
from tests.train.test_trainer import tiny_trainer_config

pytest.importorskip("wandb")
pytest.importorskip("mlflow")


def tracker_env(mp: pytest.MonkeyPatch, home: Path) -> None:
    """Offline wandb, MLflow's default store, nothing written outside `home`."""
    mp.setenv("RAGRL_HOME", str(home / "ragrl"))
    mp.setenv("WANDB_MODE", "offline")
    mp.setenv("WANDB_SILENT", "true")
    for var in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        mp.setenv(var, str(home / var.lower()))
    for var in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "WANDB_PROJECT"):
        mp.delenv(var, raising=False)
    # Unset, as the trackers set it themselves (MLflow 3 refuses its file store without it); setitem
    # first so that the patch's undo puts back what was there before (or nothing).
    mp.setitem(os.environ, "MLFLOW_ALLOW_FILE_STORE", "")
    del os.environ["MLFLOW_ALLOW_FILE_STORE"]


def wandb_history(run_dir: Path) -> dict[str, list[dict]]:
    """{offline run folder: its logged rows} from the .wandb files (a LevelDB-style log of protobuf
    records after a 7-byte ':W&B' header, in 32 KiB blocks of 7-byte-headed chunks)."""
    from wandb.proto import wandb_internal_pb2 as pb

    out = {}
    for path in sorted(run_dir.glob("wandb/offline-run-*/run-*.wandb")):
        data, pos, buf, rows = path.read_bytes(), 7, b"", []
        assert data[:4] == b":W&B"
        while pos + 7 <= len(data):
            if 32768 - pos % 32768 < 7:   # a block's tail too short for a header is padding
                pos += 32768 - pos % 32768
                continue
            length, kind = int.from_bytes(data[pos + 4:pos + 6], "little"), data[pos + 6]
            buf += data[pos + 7:pos + 7 + length]
            pos += 7 + length
            if kind in (1, 4):   # a full record, or the last chunk of one
                record = pb.Record()
                record.ParseFromString(buf)
                if record.WhichOneof("record_type") == "history":
                    rows.append({i.key or "/".join(i.nested_key): json.loads(i.value_json)
                                 for i in record.history.item})
                buf = b""
            elif kind == 0:
                buf = b""
        out[path.parent.name] = rows
    return out


def mlflow_run(run_dir: Path):
    from mlflow.tracking import MlflowClient

    ids = json.loads((run_dir / "trackers.json").read_text())["mlflow"]
    client = MlflowClient(tracking_uri=ids["tracking_uri"])
    return client, client.get_run(ids["run_id"])


@pytest.fixture(scope="module")
def tracked(tiny_model_dir, tmp_path_factory):
    """Two steps with every tracker, a --resume to three, then a report added to the same runs."""
    import wandb

    from ragrl.train.trainer import Trainer

    tmp = tmp_path_factory.mktemp("trackers")
    with pytest.MonkeyPatch.context() as mp:
        tracker_env(mp, tmp / "home")
        cfg = tiny_trainer_config(tiny_model_dir, tmp, "steps=2", "report_to=[tensorboard,wandb,mlflow]")
        Trainer(cfg).train(progress=False)
        run_dir = Path(cfg.out_dir)
        first = SimpleNamespace(ids=json.loads((run_dir / "trackers.json").read_text()),
                                wandb=wandb_history(run_dir), files=sorted(run_dir.glob("wandb/offline-run-*/files/*")))
        cfg3 = tiny_trainer_config(tiny_model_dir, tmp, "steps=3", "report_to=[tensorboard,wandb,mlflow]")
        Trainer(cfg3).train(resume=True, progress=False)
        (tmp / "before_after.md").write_text("# before / after\n")
        report_files(run_dir, cfg.report_to, [tmp / "before_after.md", tmp / "not_written.png"])
        wandb.teardown()
        yield SimpleNamespace(run_dir=run_dir, first=first, cfg=cfg)


def test_wandb_offline_run_has_the_metrics_config_and_files(tracked):
    run_dir, first = tracked.run_dir, tracked.first
    assert len(first.wandb) == 1
    (rows,) = first.wandb.values()
    assert [r["train/step"] for r in rows] == [0, 1]
    assert [r["reward_mean"] for r in rows] == pytest.approx([r["reward_mean"] for r in read_metrics(run_dir)[:2]])
    assert {p.name for p in first.files} >= {"config.yaml", "curves.png"}
    # The resume and the report continue the same wandb run (one offline folder each; `wandb sync` joins them).
    runs = wandb_history(run_dir)
    assert len(runs) == 3 and all(name.endswith("-" + first.ids["wandb"]["run_id"]) for name in runs)
    assert [r["train/step"] for rows in runs.values() for r in rows] == [0, 1, 2]
    assert list(run_dir.glob("wandb/offline-run-*/files/before_after.md"))


def test_mlflow_file_store_has_metrics_params_and_artifacts(tracked):
    run_dir, first = tracked.run_dir, tracked.first
    assert (run_dir / "mlruns").is_dir()
    client, run = mlflow_run(run_dir)
    assert run.info.run_id == first.ids["mlflow"]["run_id"]    # the resume continued the same run
    assert run.info.status == "FINISHED" and run.info.experiment_id == client.get_experiment_by_name("ragrl").experiment_id
    history = client.get_metric_history(run.info.run_id, "reward_mean")
    assert sorted(m.step for m in history) == [0, 1, 2]
    assert {m.step: m.value for m in history} == pytest.approx({r["step"]: r["reward_mean"] for r in read_metrics(run_dir)})
    assert float(run.data.params["lr"]) == tracked.cfg.lr
    assert run.data.params["algo.estimator"] == "grpo" and run.data.params["report_to"] == '["tensorboard", "wandb", "mlflow"]'
    assert len(client.get_metric_history(run.info.run_id, "time/step_s")) == 3   # a "/" is kept
    names = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"config.yaml", "curves.png", "before_after.md"} <= names and "not_written.png" not in names


def test_tensorboard_and_metrics_jsonl_still_written(tracked):
    assert [r["step"] for r in read_metrics(tracked.run_dir)] == [0, 1, 2]
    assert list((tracked.run_dir / "tb").glob("events.out.tfevents.*"))


def test_a_rewind_keeps_every_point_in_wandb_and_mlflow(tmp_path, monkeypatch):
    """A rollback re-logs earlier steps: with wandb.log(step=) wandb would drop them (its step only
    grows); against train/step they are kept, as in MLflow. Non-finite values skip MLflow only, and
    MLflow's names lose the characters it refuses."""
    import wandb

    tracker_env(monkeypatch, tmp_path / "home")
    with MetricsLogger(tmp_path, report_to=["wandb", "mlflow"], config={"lr": 1.0}, run_name="t") as logger:
        for step in range(4):
            logger.log(step, {"loss": float(step), "a@b": 1.0, "bad": math.nan if step == 1 else 0.0})
        logger.truncate_after(1, archive="rolled_back.jsonl")
        for step in (2, 3):
            logger.log(step, {"loss": 10.0 * step, "a@b": 1.0, "bad": 0.0})
    wandb.teardown()
    assert [r["step"] for r in read_metrics(tmp_path)] == [0, 1, 2, 3]
    assert not (tmp_path / "tb").exists()
    (rows,) = wandb_history(tmp_path).values()
    assert [(r["train/step"], r["loss"]) for r in rows] == [(0, 0), (1, 1), (2, 2), (3, 3), (2, 20), (3, 30)]
    client, run = mlflow_run(tmp_path)
    assert [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "loss")] == [
        (0, 0.0), (1, 1.0), (2, 2.0), (3, 3.0), (2, 20.0), (3, 30.0)]
    assert [m.step for m in client.get_metric_history(run.info.run_id, "bad")] == [0, 2, 3, 2, 3]
    assert "a_b" in run.data.metrics and run.data.params == {"lr": "1.0"}


def test_a_tracker_not_installed_is_refused_at_check_time(tiny_model_dir, tmp_path, monkeypatch):
    cfg = tiny_trainer_config(tiny_model_dir, tmp_path, "report_to=[tensorboard,wandb]")
    monkeypatch.setitem(sys.modules, "wandb", None)   # what find_spec sees for a module that cannot import
    with pytest.raises(ConfigError, match=r"report_to: wandb is not installed; pip install 'ragrl\[wandb\]'"):
        check_combinations(cfg)


def test_a_tracker_named_twice_is_refused(tiny_model_dir, tmp_path):
    cfg = tiny_trainer_config(tiny_model_dir, tmp_path, "report_to=[mlflow,tensorboard,mlflow]")
    with pytest.raises(ConfigError, match="report_to: mlflow is listed twice"):
        check_combinations(cfg)


def test_no_tracker_writes_metrics_jsonl_only(tiny_model_dir, tmp_path):
    cfg = tiny_trainer_config(tiny_model_dir, tmp_path, "report_to=[]")
    assert cfg.report_to == []
    check_combinations(cfg)
    with MetricsLogger(tmp_path / "run", report_to=cfg.report_to, config={}, run_name=cfg.name) as logger:
        logger.log(0, {"loss": 1.0})
        logger.log_file(tmp_path / "eval.jsonl")   # nothing to send it to
    assert [r["loss"] for r in read_metrics(tmp_path / "run")] == [1.0]
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["metrics.jsonl"]


def test_a_tracker_whose_store_cannot_be_written_stops_the_run_before_any_step(tiny_model_dir, tmp_path, monkeypatch):
    from ragrl.train.recipe import run_recipe

    tracker_env(monkeypatch, tmp_path / "home")
    blocker = tmp_path / "not_a_folder"
    blocker.write_text("a file where the store's parent folder should be")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", blocker.as_uri() + "/mlruns")
    cfg = tiny_trainer_config(tiny_model_dir, tmp_path, "report_to=[tensorboard,mlflow]")
    with pytest.raises(ConfigError, match=rf"report_to: mlflow cannot write its store {blocker}/mlruns: Not a directory"):
        run_recipe(cfg)
    run = Path(cfg.out_dir)
    assert read_metrics(run) == [] and not (run / "checkpoints").exists()   # stopped before step 1 (and the SFT)

    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    (run / "wandb").write_text("a file named like wandb's folder")
    cfg = tiny_trainer_config(tiny_model_dir, tmp_path, "report_to=[wandb]")
    with pytest.raises(ConfigError, match=r"report_to: wandb cannot write its store .*/wandb: it is a file, not a folder"):
        run_recipe(cfg)
