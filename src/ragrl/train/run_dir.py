"""The run directory: what a training run leaves on disk besides checkpoints.

    run_dir/
      config.yaml      the fully resolved config (write_resolved_config)
      metrics.jsonl    one JSON object per logged step: {"step": 3, "time": ..., "loss": ...}
      tb/              the same scalars as TensorBoard events (report_to: tensorboard)
      wandb/, mlruns/  the same as a wandb or MLflow run (report_to; ragrl.train.trackers)
      train.log        the `ragrl` logger's output (setup_file_logging; train.rank{r}.log: rank r's)
      training.json    each stage's wall time and the machine it ran on (record_stage), and the step
                       a wall-time bound cut RL at, if one did (record_time_bound_cut, clear_time_bound_cut)
      checkpoints/     see ragrl.train.checkpoint

metrics.jsonl is the source of truth: each line is fsynced as it is written, so a `kill -9`
loses at most the line being written, and readers drop such a torn last line. On resume the
trainer calls `truncate_after(resumed_step)` so the replayed steps are not logged twice (wandb and
MLflow cannot delete points: they keep the discarded steps, see ragrl.train.trackers).
"""
from __future__ import annotations

import json
import logging
import math
import os
import platform
import shutil
import time
from pathlib import Path

import torch
import yaml

from ragrl.errors import RagrlError, RunWriteFailed
from ragrl.paths import atomic_write_text
from ragrl.eval.plots import line_plot
from ragrl.train.checkpoint import checkpoints_dir, latest_checkpoint
from ragrl.train.disk import write_failure_reason
from ragrl.train.trackers import make_trackers

log = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"
TRAINING_FILE = "training.json"


def describe_machine() -> str:
    """The machine in a few words, for a report's "trained for how long, on what" column:
    the GPU's name where one is visible, else the CPU's model and its core count."""
    if torch.cuda.is_available():
        n = torch.cuda.device_count()
        return f"{n}x {torch.cuda.get_device_name(0)}"
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"CPU: {cpu}, {len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count()} cores"


def record_stage(run_dir: Path, stage: str, seconds: float) -> None:
    """Append one stage's wall time (`sft`, `rl`; a resume adds another `rl`) to training.json."""
    path = Path(run_dir) / TRAINING_FILE
    data = read_training_record(run_dir) or {"stages": []}
    data["stages"].append({"stage": stage, "seconds": round(float(seconds), 1), "machine": describe_machine(),
                           "date": time.strftime("%Y-%m-%dT%H:%M:%S")})
    atomic_write_text(path, json.dumps(data, indent=1))


def record_time_bound_cut(run_dir: Path, step: int, steps: int, bound_s: float) -> None:
    """Note in training.json that a wall-time bound stopped RL at `step` of the recipe's `steps`, so
    a report can say its figures are not the fixed-step ones (clear_time_bound_cut undoes it)."""
    data = read_training_record(run_dir) or {"stages": []}
    data["cut_by_time_bound"] = {"step": int(step), "steps": int(steps), "bound_s": round(float(bound_s), 1)}
    atomic_write_text(Path(run_dir) / TRAINING_FILE, json.dumps(data, indent=1))


def clear_time_bound_cut(run_dir: Path) -> None:
    """A resumed run reached its steps: training.json no longer says a bound cut it."""
    data = read_training_record(run_dir)
    if data is not None and data.pop("cut_by_time_bound", None) is not None:
        atomic_write_text(Path(run_dir) / TRAINING_FILE, json.dumps(data, indent=1))


def read_training_record(run_dir: Path) -> dict | None:
    """training.json of a run ({"stages": [{"stage", "seconds", "machine", "date"}]}), or None."""
    path = Path(run_dir) / TRAINING_FILE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise RagrlError(f"{path} is not valid JSON ({error}); delete it to start the record again") from error
    if not isinstance(data, dict) or not isinstance(data.get("stages"), list):
        raise RagrlError(f"{path} has no list of stages")
    return data


def prepare_run_dir(out_dir: Path, *, resume: bool) -> Path:
    """Create the run dir. A fresh run refuses a dir that already has checkpoints."""
    run_dir = Path(out_dir).expanduser()
    if run_dir.exists() and not run_dir.is_dir():
        raise RagrlError(f"run dir {run_dir} exists and is not a directory")
    if not resume and _has_checkpoints(run_dir):
        raise RagrlError(f"run dir {run_dir} already has checkpoints; "
                         "pass --resume or choose another --out")
    run_dir.mkdir(parents=True, exist_ok=True)
    if resume:
        remove_stale_temporaries(run_dir)
    return run_dir


def remove_stale_temporaries(run_dir: Path) -> None:
    """A run killed while exporting (best_adapter, final_adapter, best.json, training.json) leaves the
    half-written temporary that every such write goes through; a resumed run writes them again, so
    the leftovers go (a later export clears its own, but a best policy that never improves again
    would keep it for good)."""
    # pathlib's "*" matches a leading dot too: "*.tmp" covers ".training.json.tmp".
    for path in sorted(run_dir.glob(".tmp_*")) + sorted(run_dir.glob("*.tmp")):
        # Every rank prepares the dir: another may have removed it first.
        log.info("removing a temporary left by an interrupted write: %s", path)
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


def _has_checkpoints(run_dir: Path) -> bool:
    root = checkpoints_dir(run_dir)
    return root.is_dir() and ((root / "latest").exists() or latest_checkpoint(run_dir) is not None)


# The resolved config's first and last lines: a file with the first but not the last was cut short
# (a copy, a full disk), and its missing settings would silently load as defaults.
CONFIG_HEAD = "# ragrl resolved config: every setting of this run; its last line marks a complete file"
CONFIG_END = "# end of resolved config"


def write_resolved_config(run_dir: Path, cfg_dict: dict) -> Path:
    """Write `run_dir/config.yaml` atomically, keys in the config's own order, between CONFIG_HEAD and
    CONFIG_END (see check_resolved_config)."""
    path = Path(run_dir) / "config.yaml"
    atomic_write_text(path, f"{CONFIG_HEAD}\n{yaml.safe_dump(cfg_dict, sort_keys=False)}{CONFIG_END}\n")
    return path


def check_resolved_config(path: Path) -> None:
    """Refuse a run's config.yaml that was cut short: it opens with CONFIG_HEAD but does not end with
    CONFIG_END. (A file without the head was written by an older ragrl: there is nothing to check.)"""
    text = Path(path).read_text(encoding="utf-8", errors="replace")
    if text.startswith(CONFIG_HEAD) and text.rstrip("\n").rsplit("\n", 1)[-1] != CONFIG_END:
        raise RagrlError(f"{path} is cut short: it does not end with {CONFIG_END!r}, so some of the run's "
                         "settings are missing (they would load as defaults). Restore the file from a copy")


def setup_file_logging(run_dir: Path, level: int = logging.INFO, rank: int = 0) -> logging.Handler:
    """Send the `ragrl` logger's records to `run_dir/train.log` (appending, so resumes add on);
    rank r > 0 of a distributed run to `train.rank{r}.log`, so why any rank stopped can be read.

    Calling it twice for the same run dir does not duplicate lines.
    """
    path = (Path(run_dir) / ("train.log" if rank == 0 else f"train.rank{rank}.log")).resolve()
    logger = logging.getLogger("ragrl")
    for handler in logger.handlers:
        if isinstance(handler, logging.FileHandler) and Path(handler.baseFilename) == path:
            return handler
    handler = logging.FileHandler(path, mode="a", encoding="utf-8")
    handler.setLevel(level)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logger.addHandler(handler)
    if logger.level == logging.NOTSET or logger.level > level:
        logger.setLevel(level)
    return handler


class MetricsLogger:
    """Append per-step scalars to metrics.jsonl (durably), then to the trackers of `report_to`
    (TensorBoard here; wandb and MLflow in ragrl.train.trackers, given `config` and `run_name`;
    `resume` continues their runs). `tensorboard=` (older) turns TensorBoard on or off alone."""

    def __init__(self, run_dir: Path, *, report_to=("tensorboard",), config: dict | None = None,
                 run_name: str | None = None, resume: bool = False, tensorboard: bool | None = None):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / METRICS_FILE
        self.tensorboard = "tensorboard" in report_to if tensorboard is None else tensorboard
        self.trackers = make_trackers(report_to, self.run_dir, run_name, config, resume)
        _drop_torn_tail(self.path)  # else the next line would be glued onto a torn one
        self._file = open(self.path, "a", encoding="utf-8")
        self._tb = self._open_tb(purge_step=None)

    def _open_tb(self, purge_step: int | None):
        if not self.tensorboard:
            return None
        from torch.utils.tensorboard import SummaryWriter  # slow import; only when used
        return SummaryWriter(log_dir=str(self.run_dir / "tb"), purge_step=purge_step)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """Write one row. Values must be numbers (tensors/NumPy scalars are converted)."""
        row = {"step": int(step), "time": time.time()}
        for key, value in metrics.items():
            if key in row:
                raise RagrlError(f"metric name {key!r} is reserved in metrics.jsonl")
            try:
                row[key] = float(value)
            except (TypeError, ValueError) as e:
                raise RagrlError(f"metric {key!r} is not a number: {value!r}") from e
        try:
            self._file.write(json.dumps(row) + "\n")
            self._file.flush()
            os.fsync(self._file.fileno())
        except OSError as e:
            # The row may be half on disk: the next logger drops a torn last line, and a resumed run
            # redoes the steps after its checkpoint, so nothing but this row's wall time is lost.
            raise RunWriteFailed(f"could not append step {step}'s row to {self.path}: "
                                 f"{write_failure_reason(self.path, e)}; the rows before it and the run's "
                                 "checkpoints are intact. Free some space and run the same command with "
                                 "--resume") from e
        if self._tb is not None:
            for key, value in row.items():
                if key not in ("step", "time") and math.isfinite(value):
                    self._tb.add_scalar(key, value, int(step))
            self._tb.flush()
        for tracker in self.trackers:
            tracker.log(int(step), {k: v for k, v in row.items() if k not in ("step", "time")})

    def log_file(self, path: Path) -> None:
        """Keep a file (a report, a plot, the config) with the trackers' runs."""
        for tracker in self.trackers:
            tracker.log_file(path)

    def truncate_after(self, step: int, *, archive: str | None = None) -> None:
        """Keep only rows with row['step'] <= step (atomic rewrite); hide later TB events too.
        `archive`: a file name in the run dir that the removed rows are appended to (a rollback keeps
        the steps it discarded on record; a resume replays them exactly, so it drops them)."""
        self._file.close()
        every = read_metrics(self.run_dir)
        rows = [r for r in every if r["step"] <= step]
        if archive is not None and len(rows) < len(every):
            with open(self.run_dir / archive, "a", encoding="utf-8") as f:
                f.write("".join(json.dumps(r) + "\n" for r in every if r["step"] > step))
                f.flush()
                os.fsync(f.fileno())
        atomic_write_text(self.path, "".join(json.dumps(r) + "\n" for r in rows))
        self._file = open(self.path, "a", encoding="utf-8")
        if self._tb is not None:
            # TensorBoard hides events at or after purge_step written by earlier writers.
            self._tb.close()
            _wait_past_tb_files(self.run_dir / "tb")
            self._tb = self._open_tb(purge_step=step + 1)
        # wandb and MLflow cannot delete logged points: they keep the discarded steps, and the replayed
        # ones are logged to them again (wandb against its train/step axis; MLflow as a second value).

    def close(self, failed: bool = False) -> None:
        """`failed`: the run ended by an error (wandb and MLflow mark their runs so)."""
        if not self._file.closed:
            try:
                self._file.close()
            except OSError:   # the buffered tail of a row whose write already failed (reported then)
                pass
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        for tracker in self.trackers:
            tracker.close(failed=failed)
        self.trackers = []

    def __enter__(self) -> "MetricsLogger":
        return self

    def __exit__(self, exc_type, *exc) -> None:
        self.close(failed=exc_type is not None)


def _wait_past_tb_files(tb_dir: Path) -> None:
    """Readers apply a purge in file-name order, and an event file is named
    `events.out.tfevents.<unix second>.<host>.<pid>.<counter>`: within one second a counter of 10
    sorts before 9, so a purging writer opened in the same second as an earlier one could be read
    first (its purge then hides nothing). Start it in a later second than every existing file."""

    stamps = [int(p.name.split(".")[3]) for p in tb_dir.glob("events.out.tfevents.*")
              if len(p.name.split(".")) > 3 and p.name.split(".")[3].isdigit()]
    while stamps and time.time() < max(stamps) + 1:
        time.sleep(0.05)


def read_metrics(run_dir: Path) -> list[dict]:
    """All complete rows of run_dir/metrics.jsonl ([] if none). A torn last line is dropped."""
    path = Path(run_dir) / METRICS_FILE
    if not path.exists():
        return []
    text = path.read_text(encoding="utf-8", errors="replace")
    lines = text.split("\n")
    # A complete file ends with "\n", so the last piece is "" — or a line torn by a kill.
    complete, tail = lines[:-1], lines[-1]
    if tail:
        log.warning("dropping torn last line of %s: %.60r", path, tail)
    rows = []
    for lineno, line in enumerate(complete, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise RagrlError(f"{path} line {lineno} is not valid JSON: {e}") from e
        if not isinstance(row, dict) or not isinstance(row.get("step"), int):
            raise RagrlError(f"{path} line {lineno} has no integer 'step'")
        rows.append(row)
    return rows


def _drop_torn_tail(path: Path) -> None:
    """Cut a partial last line (no trailing newline) left by a kill mid-write."""
    if not path.exists() or path.stat().st_size == 0:
        return
    data = path.read_bytes()
    if data.endswith(b"\n"):
        return
    keep = data.rfind(b"\n") + 1  # 0 when the only line is torn
    log.warning("dropping torn last line of %s", path)
    with open(path, "r+b") as f:
        f.truncate(keep)
        f.flush()
        os.fsync(f.fileno())


def plot_curves(run_dir: Path, method_keys=()) -> None:
    """run_dir/curves.png from metrics.jsonl: reward, answer and search metrics, the method's own
    `plot_keys`, and every rollout/ metric of the last row (nothing without rows)."""
    rows = read_metrics(run_dir)
    if rows:
        keys = ["reward_mean", "em", "f1", "searches", "format_error_rate", "response_len", "eval/f1"]
        keys += [k for k in method_keys if k not in keys and k in rows[-1]]
        keys += sorted(k for k in rows[-1] if k.startswith("rollout/"))
        line_plot(rows, keys, Path(run_dir) / "curves.png")


def evaluation_points(rows: list[dict]) -> list[dict]:
    """The held-apart evaluations in a run's metrics rows, by RL steps trained: the start (the trainer
    logs it with step 0's row as start/...) at 0, and an eval/... row of step s at s + 1.

    >>> evaluation_points([{"step": 0, "start/f1": 10.0, "eval/f1": 11.0, "reward_mean": 0.1}, {"step": 1}])
    [{'trained_steps': 0, 'f1': 10.0}, {'trained_steps': 1, 'f1': 11.0}]
    """
    points = []
    for prefix, offset in (("start/", 0), ("eval/", 1)):
        for row in rows:
            found = {k[len(prefix):]: v for k, v in row.items() if k.startswith(prefix)}
            if found:
                points.append({"trained_steps": row["step"] + offset, **found})
    return sorted(points, key=lambda p: p["trained_steps"])
