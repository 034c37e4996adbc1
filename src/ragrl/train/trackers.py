"""Experiment trackers besides metrics.jsonl, chosen as TRL does by `report_to`.

    trackers = make_trackers(["wandb", "mlflow"], run_dir, "search_r1_grpo", asdict(cfg), resume=False)
    for t in trackers: t.log(3, {"reward_mean": 0.4}); t.log_file(run_dir / "curves.png"); t.close()

Each tracker has the same four methods: start(run_dir, run_name, config), log(step, row),
log_file(path) (a report, plot or config file, kept with the run) and close(). TensorBoard is the
third choice of report_to; it stays inside MetricsLogger (run_dir.py), which owns its rewinding.

  wandb:  offline unless WANDB_MODE says otherwise (run_dir/wandb/offline-run-*/; `wandb sync` uploads
          it), project WANDB_PROJECT or "ragrl". The x-axis is the trainer's step, logged as the
          metric train/step: wandb's own step must only grow, and a resume or rollback logs steps again.
  mlflow: MLFLOW_TRACKING_URI, or a local file store in run_dir/mlruns (the full mlflow package's `mlflow ui
          --backend-store-uri run_dir/mlruns`), experiment MLFLOW_EXPERIMENT_NAME or "ragrl"; the
          flattened config as params.

The runs' ids are kept in run_dir/trackers.json, so a --resume continues the same runs and
`report_files` adds the reports written after training to them. metrics.jsonl and TensorBoard drop
the steps a resume or rollback discards; wandb and mlflow cannot delete logged points, so they keep
them, and the replayed steps appear twice there (metrics.jsonl, rolled_back.jsonl say which counted).
"""
from __future__ import annotations

import importlib.util
import json
import logging
import math
import os
import re
import time
import uuid
from pathlib import Path
from urllib.parse import unquote, urlparse

import yaml

from ragrl.errors import ConfigError
from ragrl.paths import atomic_write_text

log = logging.getLogger(__name__)

IDS_FILE = "trackers.json"
EXTRAS = {"wandb": "wandb", "mlflow": "mlflow"}   # tracker -> the module its extra ragrl[<name>] installs


def check_trackers(report_to) -> None:
    """Refuse a repeated tracker, or one that is not installed (without importing it)."""
    for name in report_to:
        if list(report_to).count(name) > 1:
            raise ConfigError(f"report_to: {name} is listed twice")
        if name in EXTRAS and not _importable(EXTRAS[name]):
            raise ConfigError(f"report_to: {name} is not installed; pip install 'ragrl[{name}]'")


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):   # ValueError: a module in sys.modules without a spec (or None)
        return False


class WandbTracker:
    def __init__(self, run_id: str | None = None):
        self.run_id, self.run = run_id or uuid.uuid4().hex[:16], None

    def start(self, run_dir, run_name, config):
        import wandb  # optional dependency: ragrl[wandb]
        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", "ragrl"), name=run_name, dir=str(run_dir),
                              config=config, mode=os.environ.get("WANDB_MODE", "offline"), id=self.run_id,
                              resume="allow")
        # With wandb.log(row, step=step), a step below one already logged is dropped with a warning,
        # which would lose every row after a rollback until the step passes the one that tripped.
        self.run.define_metric("train/step")
        self.run.define_metric("*", step_metric="train/step")

    def log(self, step, row):
        self.run.log({**row, "train/step": step})

    def log_file(self, path):
        path = Path(path).resolve()
        self.run.save(str(path), base_path=str(path.parent), policy="now")

    def close(self, failed=False):
        if self.run is not None:
            self.run.finish(exit_code=1 if failed else 0)
            self.run = None

    def ids(self):
        return {"run_id": self.run_id}


class MlflowTracker:
    def __init__(self, run_id: str | None = None, tracking_uri: str | None = None):
        self.run_id, self.tracking_uri, self.client = run_id, tracking_uri, None

    def start(self, run_dir, run_name, config):
        from mlflow.entities import Param  # optional dependency: ragrl[mlflow]
        from mlflow.exceptions import MlflowException  # optional dependency: ragrl[mlflow]
        from mlflow.tracking import MlflowClient  # optional dependency: ragrl[mlflow]

        uri = mlflow_uri(run_dir)
        if uri.startswith("file:"):   # MLflow 3 refuses its file store (in maintenance mode) unless told
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        if uri != self.tracking_uri:  # the stored run lives in another store: a new run
            self.run_id = None
        self.tracking_uri, self.client = uri, MlflowClient(tracking_uri=uri)
        if self.run_id is not None:
            try:
                self.client.update_run(self.run_id, status="RUNNING")
                return
            except MlflowException:
                log.warning("mlflow run %s is not in %s; starting a new one", self.run_id, uri)
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME", "ragrl")
        exp = self.client.get_experiment_by_name(name)
        run = self.client.create_run(exp.experiment_id if exp else self.client.create_experiment(name),
                                     run_name=run_name)
        self.run_id = run.info.run_id
        if config is not None:
            # MLflow limits a param's name and value (250 and 500 characters on older servers): the full
            # config is kept as the artifact config.yaml too.
            params = [Param(_metric_name(k)[:250], v[:500]) for k, v in _flatten(config).items()]
            for i in range(0, len(params), 100):   # at most 100 params per batch
                self.client.log_batch(self.run_id, params=params[i:i + 100])
            self.client.log_text(self.run_id, yaml.safe_dump(config, sort_keys=False), "config.yaml")

    def log(self, step, row):
        from mlflow.entities import Metric  # optional dependency: ragrl[mlflow]
        now = int(time.time() * 1000)
        # Non-finite values are left out, as TensorBoard does: MLflow stores NaN, but its charts and
        # some backends (a database's float column) fail on it; metrics.jsonl keeps them.
        metrics = [Metric(_metric_name(k), v, now, step) for k, v in row.items() if math.isfinite(v)]
        for i in range(0, len(metrics), 1000):   # at most 1000 metrics per batch
            self.client.log_batch(self.run_id, metrics=metrics[i:i + 1000])

    def log_file(self, path):
        self.client.log_artifact(self.run_id, str(path))

    def close(self, failed=False):
        if self.client is not None and self.run_id is not None:
            self.client.set_terminated(self.run_id, status="FAILED" if failed else "FINISHED")
            self.client = None

    def ids(self):
        return {"run_id": self.run_id, "tracking_uri": self.tracking_uri}


TRACKERS = {"wandb": WandbTracker, "mlflow": MlflowTracker}


def mlflow_uri(run_dir) -> str:
    """MLflow's tracking URI for a run: MLFLOW_TRACKING_URI, else a file store in run_dir/mlruns."""
    return os.environ.get("MLFLOW_TRACKING_URI") or (Path(run_dir) / "mlruns").resolve().as_uri()


def tracker_store(name: str, run_dir) -> str:
    """Where tracker `name` writes for a run in `run_dir`: a local folder, or an MLflow server's URI."""
    if name == "wandb":
        return str(Path(run_dir) / "wandb")   # start() passes dir=run_dir: WANDB_DIR does not apply
    uri = mlflow_uri(run_dir)
    return unquote(urlparse(uri).path) if uri.startswith("file:") else uri


def check_tracker_stores(report_to, run_dir) -> None:
    """Refuse, naming it, a tracker whose local store cannot be written: before any training (the
    trackers themselves would fail later, or lose rows). A tracker server is checked when it starts."""
    for name in (n for n in report_to if n in TRACKERS):
        store = tracker_store(name, run_dir)
        if "://" in store:
            continue
        if Path(store).exists() and not Path(store).is_dir():
            raise ConfigError(f"report_to: {name} cannot write its store {store}: it is a file, not a folder; "
                              f"move it away, or leave {name} out of report_to")
        try:
            Path(store).mkdir(parents=True, exist_ok=True)
            probe = Path(store) / f".ragrl-write-probe-{os.getpid()}"
            probe.write_text("ok")
            probe.unlink()
        except OSError as e:
            raise ConfigError(f"report_to: {name} cannot write its store {store}: {e.strerror or e}; fix that "
                              f"path, or leave {name} out of report_to") from e


def make_trackers(report_to, run_dir, run_name, config, resume: bool) -> list:
    """Start the trackers of `report_to` (tensorboard is MetricsLogger's); a resume continues the runs
    whose ids run_dir/trackers.json keeps, a fresh run starts new ones and keeps their ids there. A
    tracker that cannot write its store, or fails to start, stops the run here, naming it and the store."""
    check_tracker_stores(report_to, run_dir)
    stored = _read_ids(run_dir) if resume else {}
    started: dict = {}
    try:
        for name in (n for n in report_to if n in TRACKERS):
            started[name] = TRACKERS[name](**stored.get(name, {}))
            try:
                started[name].start(run_dir, run_name, config)
            except Exception as e:   # noqa: BLE001 - wandb's and MLflow's errors share no base class
                raise ConfigError(f"report_to: {name} could not start its run in {tracker_store(name, run_dir)}: "
                                  f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:300]}") from e
    except BaseException:
        for tracker in started.values():   # close() is safe on one whose start failed
            tracker.close(failed=True)
        raise
    if started:
        _write_ids(run_dir, {**stored, **{name: t.ids() for name, t in started.items()}})
    return list(started.values())


def report_files(run_dir, report_to, paths) -> None:
    """Add files written after training (a before/after report, plots) to the training run's trackers,
    found by the ids in run_dir/trackers.json. A tracker that has no stored run is skipped."""
    stored = _read_ids(run_dir)
    names = [n for n in report_to if n in TRACKERS and n in stored]
    if not names:
        return
    try:
        for tracker in make_trackers(names, run_dir, None, None, resume=True):
            try:
                for path in paths:
                    if Path(path).exists():
                        tracker.log_file(path)
            finally:
                tracker.close()
    except Exception as e:   # the files are on disk already: a tracker that fails now costs a warning
        log.warning("could not add %s to the trackers %s of %s: %s", [Path(p).name for p in paths], names, run_dir, e)


def _read_ids(run_dir) -> dict:
    path = Path(run_dir) / IDS_FILE
    return json.loads(path.read_text()) if path.exists() else {}


def _write_ids(run_dir, ids: dict) -> None:
    atomic_write_text(Path(run_dir) / IDS_FILE, json.dumps(ids, indent=1))


def _metric_name(key: str) -> str:
    """MLflow's names allow letters, digits and _ - . space / : only.

    >>> _metric_name("reward/em@5 (x)")
    'reward/em_5 _x_'
    """
    return re.sub(r"[^A-Za-z0-9_\-. /:]", "_", key)


def _flatten(config: dict, prefix: str = "") -> dict[str, str]:
    """{"algo": {"lr": 1e-5}, "report_to": ["wandb"]} -> {"algo.lr": "1e-05", "report_to": '["wandb"]'}.

    >>> _flatten({"algo": {"lr": 1e-5}, "report_to": ["wandb"], "name": "x"})
    {'algo.lr': '1e-05', 'report_to': '["wandb"]', 'name': 'x'}
    """
    out = {}
    for key, value in config.items():
        if isinstance(value, dict) and value:
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value if isinstance(value, str) else json.dumps(value, default=str)
    return out
