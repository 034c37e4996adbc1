"""`ragrl train` for benchmarks/soak.py: the real CLI and trainer, with the faults that can only
come from inside the process, and a note of where the run is for the soak to aim its kills at.

Usage: python soak_worker.py train RECIPE --set ... (the `ragrl` CLI's arguments)
Env:   RAGRL_SOAK_CONTROL=DIR      DIR/phase is rewritten as the run moves: "STEP PHASE", PHASE one of
                                   rollout, reward, update, evaluation, row written, checkpoint
                                   (its start), checkpoint write (every file written and synced,
                                   not yet renamed into place), checkpoint written (STEP: the
                                   trainer's step then). DIR/hold naming a PHASE is taken when the
                                   run reaches it: the run then waits there 60 s for the soak's kill
                                   (a moment too short to aim at otherwise). DIR/rows_written gets
                                   the step of every metrics row written, by every launch.
                                   DIR/disk_full, when present as a checkpoint is written, is taken
                                   (deleted) and fails that write as a full disk does: "K FRACTION"
                                   keeps FRACTION of the bytes of the checkpoint's K-th file (mod
                                   their count, sorted by path), removes the files written after it
                                   (by modification time), and raises ENOSPC.
       RAGRL_SOAK_NAN_STEPS=3,9    the updates of these steps see NaN log-probs, in every launch
                                   (the uninterrupted reference run gets the same steps).
"""
import errno
import os
import sys
import time
from pathlib import Path

import torch

import ragrl.train.trainer as trainer_module
from ragrl.train import checkpoint
from ragrl.train.run_dir import MetricsLogger
from ragrl.train.trainer import Trainer

CONTROL = Path(os.environ["RAGRL_SOAK_CONTROL"])
NAN_STEPS = {int(s) for s in os.environ.get("RAGRL_SOAK_NAN_STEPS", "").split(",") if s.strip()}
STEP = [0]   # the trainer's step as last seen, for phases noted outside a Trainer method


def note(phase: str) -> None:
    # One small write; the reader (soak.py) treats an empty or partial file as "unknown".
    (CONTROL / "phase").write_text(f"{STEP[0]} {phase}")
    hold = CONTROL / "hold"
    try:
        held = hold.read_text() == phase
    except OSError:
        held = False
    if held:
        hold.unlink()
        time.sleep(60)


def install_phase_notes() -> None:
    real_at, real_log, real_save = Trainer._at, MetricsLogger.log, trainer_module.save_checkpoint

    def at(self, phase):
        STEP[0] = self.step
        note(phase)
        return real_at(self, phase)

    def log_row(self, step, metrics):
        out = real_log(self, step, metrics)
        with open(CONTROL / "rows_written", "a") as f:   # every row any launch wrote: the soak's count of work redone
            f.write(f"{step}\n")
        note("row written")
        return out

    def save(*args, **kwargs):
        out = real_save(*args, **kwargs)
        note("checkpoint written")
        return out

    Trainer._at, MetricsLogger.log, trainer_module.save_checkpoint = at, log_row, save
    checkpoint._before_rename = lambda tmp: note("checkpoint write")


def install_disk_full() -> None:
    real_write = checkpoint._write_files

    def write_files(tmp: Path, *args, **kwargs):
        order = CONTROL / "disk_full"
        try:
            k, fraction = order.read_text().split()
            order.unlink()
        except (OSError, ValueError):   # no order (or one still being written): a normal write
            return real_write(tmp, *args, **kwargs)
        real_write(tmp, *args, **kwargs)
        # The disk filled while the K-th file was written: it holds FRACTION of its bytes, and the
        # files after it were never written.
        files = sorted(p for p in tmp.rglob("*") if p.is_file())
        victim = files[int(k) % len(files)]
        written = victim.stat().st_mtime_ns
        for later in [p for p in files if p.stat().st_mtime_ns > written]:
            later.unlink()
        data = victim.read_bytes()
        victim.write_bytes(data[: int(len(data) * float(fraction))])
        (CONTROL / "disk_full_hit").write_text(str(victim.relative_to(tmp)))
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(victim))

    checkpoint._write_files = write_files


def install_nan_losses() -> None:
    real_update = Trainer._update

    def update(self, trajs, experts):
        if self.step not in NAN_STEPS:
            return real_update(self, trajs, experts)
        forward = self.policy.forward

        def poisoned(batch, **kw):
            out = forward(batch, **kw)
            if torch.is_grad_enabled():   # the update's forward; the old log-probs stay finite
                out["logprobs"] = out["logprobs"] * float("nan")
            return out
        self.policy.forward = poisoned
        try:
            return real_update(self, trajs, experts)
        finally:
            del self.policy.forward   # the class's forward again

    Trainer._update = update


if __name__ == "__main__":
    install_phase_notes()
    install_disk_full()
    install_nan_losses()
    from ragrl.cli.main import main

    sys.argv = ["ragrl", *sys.argv[1:]]
    main()
