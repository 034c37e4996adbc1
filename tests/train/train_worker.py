"""`ragrl train` with an injected fault, for test_resume: hang inside one checkpoint write.

Usage: python train_worker.py train RECIPE --set ... (the `ragrl` CLI arguments)
Env:   RAGRL_TEST_HANG_AT_CHECKPOINT=K   while writing checkpoint step K, after every file is
       RAGRL_TEST_READY=PATH             fsynced but before the rename that publishes it, write
                                         PATH and sleep, so the test can SIGKILL the process there.
       RAGRL_TEST_DISK_FULL_AT_CHECKPOINT=K
                                         while writing checkpoint step K, optimizer.pt gets half
                                         its bytes and then ENOSPC, as on a full disk.
       RAGRL_TEST_RANK_FAULT=kill|stop|hang  in rank RAGRL_TEST_FAULT_RANK's rollout of step
       RAGRL_TEST_FAULT_RANK=R           RAGRL_TEST_FAULT_STEP: SIGKILL itself, SIGSTOP itself (every
       RAGRL_TEST_FAULT_STEP=K           thread frozen), or hang its main thread for 10 minutes
                                         (its threads go on). stop writes its pid to
                                         RAGRL_TEST_FAULT_PIDFILE first.
Everything else is the real CLI and trainer.
"""
import errno
import io
import os
import signal
import sys
import time
from pathlib import Path

import torch

from ragrl.train import checkpoint


def install_hang(step: int, ready: Path) -> None:
    def hang(tmp_dir: Path) -> None:
        if tmp_dir.name.endswith(checkpoint.step_dir_name(step)):
            ready.write_text(str(tmp_dir))
            time.sleep(600)

    checkpoint._before_rename = hang


def install_disk_full(step: int) -> None:
    """torch.save of checkpoint K's optimizer.pt writes half the file, then fails as a full disk does."""
    real_save = torch.save

    def save(obj, path, *args, **kwargs):
        path = Path(path)
        if path.name == "optimizer.pt" and path.parent.name.endswith(checkpoint.step_dir_name(step)):
            data = io.BytesIO()
            real_save(obj, data, *args, **kwargs)
            path.write_bytes(data.getvalue()[: len(data.getvalue()) // 2])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        return real_save(obj, path, *args, **kwargs)

    checkpoint.torch.save = save


def install_rank_fault(kind: str, rank: int, step: int) -> None:
    from ragrl.train.trainer import Trainer

    real_roll_out = Trainer._roll_out

    def roll_out(self, samples):
        if self.rank == rank and self.step == step:
            if kind == "stop":
                time.sleep(1)   # frozen partway into the rollout: its heartbeat has said so by then
                # torchrun starts a rank in a session of its own: the test ends it by this pid
                Path(os.environ["RAGRL_TEST_FAULT_PIDFILE"]).write_text(str(os.getpid()))
            if kind in ("kill", "stop"):
                os.kill(os.getpid(), signal.SIGKILL if kind == "kill" else signal.SIGSTOP)
            time.sleep(600)
        return real_roll_out(self, samples)

    Trainer._roll_out = roll_out


if __name__ == "__main__":
    if os.environ.get("RAGRL_TEST_RANK_FAULT"):
        install_rank_fault(os.environ["RAGRL_TEST_RANK_FAULT"], int(os.environ["RAGRL_TEST_FAULT_RANK"]),
                           int(os.environ["RAGRL_TEST_FAULT_STEP"]))
    if os.environ.get("RAGRL_TEST_DISK_FULL_AT_CHECKPOINT"):
        install_disk_full(int(os.environ["RAGRL_TEST_DISK_FULL_AT_CHECKPOINT"]))
    if os.environ.get("RAGRL_TEST_HANG_AT_CHECKPOINT"):
        install_hang(int(os.environ["RAGRL_TEST_HANG_AT_CHECKPOINT"]), Path(os.environ["RAGRL_TEST_READY"]))
    from ragrl.cli.main import main

    sys.argv = ["ragrl", *sys.argv[1:]]
    main()
