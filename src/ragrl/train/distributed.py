"""Data-parallel glue: one trainer process per rank, gradients all-reduced (DDP style).

What is supported: N identical processes started by `torchrun` or `accelerate launch`. Each
rank rolls out its own slice of the step's questions; `update.py` divides every loss by the
*global* token (or sequence) count and sums gradients over ranks, so N ranks with B/N rows each
take the same optimizer step as one process with B.
Two ways to shard:
  * parameters (FSDP2, `shard_params`, on by default under `accelerate launch --use_fsdp`;
    ragrl.policy.fsdp): each rank stores 1/world of every weight, gradient and Adam moment;
  * optimizer state only (ZeRO stage 1, `shard_optimizer`, on by default under `accelerate
    launch --use_deepspeed`): each rank keeps Adam's moments for its share of the parameters,
    steps that share, and broadcasts it; parameters and gradients stay replicated.

How to start it:

    torchrun --nproc_per_node 2 -m ragrl.cli.main train search_r1_grpo --variant tiny
    accelerate launch --multi_gpu --num_processes 2 -m ragrl.cli.main train ...
    accelerate launch --use_fsdp --num_processes 2 -m ragrl.cli.main train ...   # FSDP2
    accelerate launch --use_deepspeed --num_processes 2 -m ragrl.cli.main train ...   # ZeRO-1

Note: `accelerate launch --cpu --num_processes 2` starts ONE process unless an MPI hostfile is
given (accelerate's CPU launcher is mpirun); on a CPU-only host `--multi_gpu` is what makes it
go through torchrun, and `init_distributed` then picks gloo because there is no CUDA.
"""
from __future__ import annotations

import datetime
import logging
import os

import torch
import torch.distributed as dist

from ragrl.errors import ConfigError
from ragrl.policy.fsdp import local_nbytes

log = logging.getLogger("ragrl.train")


def dist_info() -> tuple[int, int]:
    """(rank, world size) of the default process group, (0, 1) without one."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def is_distributed() -> bool:
    return dist_info()[1] > 1


def init_distributed(timeout_s: float = 1800.0) -> tuple[int, int]:
    """Join the process group a launcher set up (env WORLD_SIZE > 1); return (rank, world).

    Idempotent: an already initialised group is used as is. Backend: nccl when CUDA is
    available and the launcher did not ask for CPU (accelerate's ACCELERATE_USE_CPU), else gloo.
    On CUDA each rank uses device LOCAL_RANK.
    """
    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    if world <= 1 or dist_info()[1] > 1:
        return dist_info()
    if not dist.is_available():
        raise ConfigError(f"WORLD_SIZE={world} but this torch build has no torch.distributed")
    missing = [k for k in ("RANK", "MASTER_ADDR", "MASTER_PORT") if not os.environ.get(k)]
    if missing:
        raise ConfigError(f"WORLD_SIZE={world} but {', '.join(missing)} not set; start the run with "
                          "torchrun or accelerate launch")
    force_cpu = _env_flag("ACCELERATE_USE_CPU")
    use_cuda = torch.cuda.is_available() and not force_cpu
    if use_cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    # Rollouts of different lengths make ranks wait for each other at the gradient all-reduce;
    # the timeout must cover the slowest rank's rollout, not just a collective.
    dist.init_process_group("nccl" if use_cuda else "gloo", timeout=datetime.timedelta(seconds=timeout_s))
    rank, world = dist_info()
    log.info("distributed: rank %d of %d (%s)", rank, world, dist.get_backend())
    return rank, world


def barrier() -> None:
    """Wait until every rank gets here (nothing to wait for in one process)."""
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def close_distributed(*, ok: bool = True, rank_lost: bool = False) -> None:
    """Leave the process group, if one was joined: wait for every rank when the run ended
    well, then destroy the group. Without this, gloo's worker threads can still be running
    when the interpreter exits, and a rank aborts ("terminate called without an active
    exception") after all its work is done, failing the launch. After a lost rank
    (`rank_lost`, ragrl.errors.RankLost) the group is left as it is: a collective of it timed
    out, and tearing it down can abort the process (SIGABRT) before its error is reported;
    the CLI leaves such a process without the interpreter's teardown (ragrl.cli.main)."""
    if not (dist.is_available() and dist.is_initialized()) or rank_lost:
        return
    if ok:
        dist.barrier()
    dist.destroy_process_group()


def wants_sharded_params(setting: bool | None, world: int) -> bool:
    """Whether to shard parameters (FSDP2, ragrl.policy.fsdp): never on one rank; `setting`
    when given; else on when the launcher asked for FSDP (accelerate sets ACCELERATE_USE_FSDP)."""
    if world <= 1:
        return False
    return bool(setting) if setting is not None else _env_flag("ACCELERATE_USE_FSDP")


def wants_sharded_optimizer(setting: bool | None, world: int, params_sharded: bool = False) -> bool:
    """Whether to wrap the optimizer in ZeRO-1: never on one rank or over sharded parameters
    (their Adam state is sharded already); `setting` when given; else on when the launcher
    asked for DeepSpeed (accelerate sets ACCELERATE_USE_DEEPSPEED)."""
    if world <= 1 or params_sharded:
        return False
    return bool(setting) if setting is not None else _env_flag("ACCELERATE_USE_DEEPSPEED")


def _env_flag(name: str) -> bool:
    """A launcher's boolean environment variable (accelerate writes "true"/"false")."""
    return os.environ.get(name, "").lower() in ("1", "true", "yes")


def make_optimizer(groups: list[dict], *, lr: float, weight_decay: float, shard: bool) -> torch.optim.Optimizer:
    """AdamW over `groups`; with `shard`, wrapped in ZeRO-1 (each rank holds 1/world of the
    state). Empty groups are kept out of the sharded optimizer (ZeRO cannot partition them)."""
    if not shard:
        return torch.optim.AdamW(groups, lr=lr, weight_decay=weight_decay)
    from torch.distributed.optim import ZeroRedundancyOptimizer  # late: only sharded runs, where it exists

    groups = [g for g in groups if g["params"]]
    opt = ZeroRedundancyOptimizer(groups[0]["params"], optimizer_class=torch.optim.AdamW, lr=lr,
                                  weight_decay=weight_decay)
    for g in groups[1:]:
        opt.add_param_group(g)
    return opt


def optimizer_state_bytes(optimizer) -> int:
    """Bytes of optimizer state this rank holds (the local shard under ZeRO)."""
    # ZeroRedundancyOptimizer keeps its shard's optimizer in `.optim`; not importing it here
    # keeps torch.distributed.optim (and its torch.jit warnings) off single-process runs.
    local = getattr(optimizer, "optim", optimizer)
    # An FSDP parameter's moments are DTensors: count the shard this rank holds.
    return sum(local_nbytes(t) for st in local.state.values() for t in st.values() if torch.is_tensor(t))


def check_divisible(questions_per_step: int, world: int) -> None:
    """Every rank must hold the same number of rows, or the per-minibatch collectives in
    `ppo_update` would not line up (one rank would wait forever)."""
    if questions_per_step % world:
        raise ConfigError(f"questions_per_step={questions_per_step} must be a multiple of the number "
                          f"of processes ({world}) so every rank rolls out the same number of questions")


def all_sum(values: list[float]) -> list[float]:
    """Element-wise sum over ranks (float64; identity without a process group)."""
    if not is_distributed():
        return list(values)
    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t)
    return t.tolist()


def reduce_metrics(row: dict, weight: float, summed: tuple[str, ...] = ()) -> dict:
    """Metrics of the whole step from each rank's own: weighted mean over ranks (weight = that
    rank's trajectory count), plain sum for the keys in `summed` (e.g. throughput)."""
    if not is_distributed():
        return row
    keys = sorted(k for k, v in row.items() if isinstance(v, (int, float)))
    vals = all_sum([float(row[k]) * (1.0 if k in summed else weight) for k in keys] + [weight])
    total = vals.pop()
    out = dict(row)
    out.update({k: v if k in summed else v / max(total, 1e-12) for k, v in zip(keys, vals)})
    return out
