"""Data parallelism: two gloo ranks, each with half the rows, take the step one process takes
with all of them; and `ragrl train` runs end to end under `accelerate launch` with 2 processes."""
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ragrl.policy.lm import LMPolicy
from ragrl.train.config import AlgoConfig
from ragrl.train.distributed import close_distributed, init_distributed
from ragrl.train.update import ppo_update, prepare
from tests.train.test_trainer import params_of, policy, synthetic_batch

# 8 rows in 4 groups; rank 1's rows are much shorter, so per-rank token means would be wrong.
LENGTHS = [40, 36, 32, 40, 20, 24, 22, 26]
SCORES = (1.0, 0.0, 0.2, 0.9, 0.6, 0.1, 0.3, 0.8)
AGGS = ("token_mean", "seq_mean_token_mean")
HALVES = (slice(0, 4), slice(4, 8))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one_step(model_dir, agg: str, rows: slice, max_grad_norm=1.0, make_opt=None, keep=None) -> list[torch.Tensor]:
    """prepare + ppo_update (GRPO, one minibatch of all 8 rows over all ranks) on `rows`."""
    model, _, _ = policy(model_dir)
    batch = synthetic_batch(model, LENGTHS, SCORES).select(list(range(8))[rows])
    cfg = AlgoConfig(estimator="grpo", loss_agg=agg, minibatch_size=8, micro_batch_size=3, entropy_coef=0.01)
    prep = prepare(LMPolicy(model, None, None), batch, cfg, 0.0, cfg.micro_batch_size)
    # SGD: the step is linear in the gradient (Adam's first step is ~sign(g), which would
    # amplify float noise in near-zero gradients).
    opt = make_opt(params_of(model)) if make_opt else torch.optim.SGD(params_of(model), lr=0.5)
    model.train()
    ppo_update(LMPolicy(model, None, None), opt, prep, cfg, 0.0, max_grad_norm, torch.Generator().manual_seed(1))
    if keep is not None:
        keep.append(opt)
    return [p.detach().clone() for p in params_of(model)]


def join_group(rank: int, world: int, port: int) -> tuple[int, int]:
    """In a spawned test process: set the launcher's variables, one thread, join the gloo group."""
    os.environ.update(WORLD_SIZE=str(world), RANK=str(rank), LOCAL_RANK=str(rank),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    return init_distributed()


def _rank_main(rank: int, world: int, port: int, model_dir: str, out_dir: str) -> None:
    assert join_group(rank, world, port) == (rank, world) and dist.get_backend() == "gloo"
    assert init_distributed() == (rank, world)  # idempotent
    for agg in AGGS:
        torch.save(one_step(model_dir, agg, HALVES[rank]), os.path.join(out_dir, f"{agg}.{rank}.pt"))
    close_distributed()   # what `ragrl train` does at the end: every rank waits, then leaves
    assert not dist.is_initialized()
    close_distributed()   # without a group: nothing to do


def _lost_rank_main(rank: int, world: int, port: int) -> None:
    join_group(rank, world, port)
    close_distributed(ok=False, rank_lost=True)   # a peer was lost: the broken group is left alone
    assert dist.is_initialized()
    close_distributed(ok=False)                    # any other failure still destroys it
    assert not dist.is_initialized()


def test_a_lost_rank_leaves_its_process_group_undestroyed():
    """Destroying a group whose collective timed out can abort the process (SIGABRT) before its
    RankLost is reported; the end-to-end check is test_rank_watch's hung-rank test (exit 69)."""
    mp.spawn(_lost_rank_main, args=(2, free_port()), nprocs=2, join=True)


def test_two_ranks_take_the_same_step_as_one_process(tiny_model_dir, tmp_path):
    mp.spawn(_rank_main, args=(2, free_port(), str(tiny_model_dir), str(tmp_path)), nprocs=2, join=True)
    init = [p.detach().clone() for p in params_of(policy(tiny_model_dir)[0])]
    for agg in AGGS:
        single = one_step(tiny_model_dir, agg, slice(0, 8))
        ranks = [torch.load(tmp_path / f"{agg}.{r}.pt") for r in range(2)]
        assert max(float((a - b).abs().max()) for a, b in zip(single, init)) > 1e-3  # a real step
        for got in ranks:
            diff = max(float((a - b).abs().max()) for a, b in zip(got, single))
            assert diff < 1e-5, (agg, diff)

    # The check can fail: averaging each half's own token mean (what a naive DDP loss does)
    # lands elsewhere, because the halves hold different numbers of action tokens.
    halves = [one_step(tiny_model_dir, "token_mean", h, max_grad_norm=1e9) for h in HALVES]
    exact = one_step(tiny_model_dir, "token_mean", slice(0, 8), max_grad_norm=1e9)
    naive = [(a + b) / 2 for a, b in zip(*halves)]
    assert max(float((a - b).abs().max()) for a, b in zip(naive, exact)) > 1e-4


def _zero_rank_main(rank: int, world: int, port: int, model_dir: str, out_dir: str) -> None:
    from ragrl.train.distributed import make_optimizer, optimizer_state_bytes

    join_group(rank, world, port)
    out = {}
    for shard in (False, True):
        opts = []
        # two parameter groups, as with PPO's value head
        out[shard] = one_step(model_dir, "token_mean", HALVES[rank], keep=opts, make_opt=lambda ps: make_optimizer(
            [{"params": ps[:-2]}, {"params": ps[-2:]}], lr=1e-2, weight_decay=0.01, shard=shard))
        out[f"bytes_{shard}"] = optimizer_state_bytes(opts[0])
        if shard:
            opts[0].consolidate_state_dict(to=0)   # a collective: every rank takes part
            if rank == 0:
                out["consolidated"] = opts[0].state_dict()
        else:
            out["plain_state"] = opts[0].state_dict()
    torch.save(out, os.path.join(out_dir, f"zero.{rank}.pt"))
    dist.destroy_process_group()


def test_zero1_sharded_adam_takes_the_replicated_step_with_half_the_state_per_rank(tiny_model_dir, tmp_path):
    mp.spawn(_zero_rank_main, args=(2, free_port(), str(tiny_model_dir), str(tmp_path)), nprocs=2, join=True)
    ranks = [torch.load(tmp_path / f"zero.{r}.pt", weights_only=False) for r in range(2)]
    init = [p.detach().clone() for p in params_of(policy(tiny_model_dir)[0])]
    for r in ranks:
        assert max(float((a - b).abs().max()) for a, b in zip(r[False], init)) > 1e-3  # a real step
        # AdamW is element-wise: the shard owner's update is the replicated one, bit for bit
        assert all(torch.equal(a, b) for a, b in zip(r[True], r[False]))
        assert 0 < r["bytes_True"] < 0.75 * r["bytes_False"]
    assert abs(sum(r["bytes_True"] for r in ranks) - ranks[0]["bytes_False"]) < 0.01 * ranks[0]["bytes_False"]
    # rank 0's consolidated state (what a checkpoint holds) equals the replicated optimizer's
    full, plain = ranks[0]["consolidated"]["state"], ranks[0]["plain_state"]["state"]
    assert sorted(full) == sorted(plain)
    assert all(torch.equal(full[i]["exp_avg_sq"], plain[i]["exp_avg_sq"]) for i in plain)


@pytest.mark.parametrize("launcher", ["ddp", "fsdp", "deepspeed"])
def test_ragrl_train_under_accelerate_launch_with_two_processes(tiny_model_dir, tmp_path, launcher):
    """`accelerate launch` runs `ragrl train` unchanged. With --use_fsdp the parameters are
    sharded (FSDP2), with --use_deepspeed the optimizer state (ZeRO-1); either way the checkpoint
    holds the whole state, and --resume goes on from it."""
    from tests.train.test_trainer_resume import write_jsonl
    from ragrl.datasets import load_questions
    from ragrl.train.run_dir import read_metrics

    write_jsonl(tmp_path / "train.jsonl", load_questions("demo-train")[:4])
    write_jsonl(tmp_path / "corpus.jsonl", [{"id": f"p{i}", "title": f"t{i}", "text": f"passage number {i}"}
                                            for i in range(50)])
    out = tmp_path / "run"
    sets = {"model.name": tiny_model_dir, "out_dir": out, "steps": 1, "questions_per_step": 2, "rollout.n": 2,
            "rollout.max_turns": 2, "rollout.max_turn_tokens": 8, "rollout.max_response_tokens": 48,
            "sft.steps": 0, "eval_every": 0, "save_every": 1, "data.train": tmp_path / "train.jsonl",
            "data.corpus": tmp_path / "corpus.jsonl"}

    def launch(*extra: str) -> str:
        # `--cpu` would make accelerate start ONE process (its multi-CPU launcher is mpirun); on a
        # CPU-only host `--multi_gpu` (or `--use_fsdp`) goes through torchrun, and
        # init_distributed picks gloo.
        cmd = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "2",
               "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
               {"ddp": "--multi_gpu", "fsdp": "--use_fsdp", "deepspeed": "--use_deepspeed"}[launcher],
               "--main_process_port", str(free_port()), "-m", "ragrl.cli.main", "train", "search_r1_grpo",
               "--variant", "tiny", *[a for k, v in sets.items() for a in ("--set", f"{k}={v}")], *extra]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "RAGRL_HOME": str(tmp_path / "home")}
        if launcher == "deepspeed":   # install.sh keeps deepspeed out of the venv (see there)
            side = Path(sys.prefix) / "deepspeed-side"
            assert (side / "deepspeed").is_dir(), f"{side} is missing: run ./install.sh"
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(side), env.get("PYTHONPATH")]))
        res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
        # rank 0's own traceback first: the tail is mostly the launcher's summary and the other
        # rank's "connection closed by peer"
        rank0 = "\n".join(line for line in res.stderr.splitlines() if line.startswith("[rank0]"))
        # and why any other rank stopped: its ragrl error line or its own traceback's last lines
        others = "\n".join(line for line in res.stderr.splitlines()
                           if line.startswith("error: ") or line.startswith(("[rank1]", "[rank2]", "[rank3]")))
        # and every rank's own train log (train.log, train.rank1.log): the lines a rank wrote before it died
        logs = "".join(f"\n--- {p.name}:\n" + "\n".join(p.read_text().splitlines()[-15:])
                       for p in sorted(out.glob("train*.log")))
        assert res.returncode == 0, (rank0[-3000:] + "\n--- other ranks:\n" + others[-2000:] + logs + "\n---\n"
                                     + res.stdout[-1500:] + res.stderr[-2000:])
        return res.stdout + res.stderr

    log = launch()
    assert "rank 0 of 2 (gloo)" in log and "rank 1 of 2 (gloo)" in log
    assert ("parameters sharded over the process group (FSDP2)" in log) == (launcher == "fsdp")
    assert ("optimizer state sharded over 2 ranks (ZeRO-1)" in log) == (launcher == "deepspeed")
    rows = read_metrics(out)
    assert [r["step"] for r in rows] == [0]  # one writer: rank 0
    assert rows[0]["turns"] > 0 and rows[0]["updates"] == 1
    assert (out / "checkpoints" / "latest").read_text().strip() == "step_000001"
    saved = torch.load(out / "checkpoints" / "step_000001" / "optimizer.pt", weights_only=False)
    n_trainable = sum(1 for g in saved["param_groups"] for _ in g["params"])
    assert n_trainable > 0 and len(saved["state"]) == n_trainable  # the whole state, not one shard
    if launcher != "ddp":
        sets["steps"] = 2
        launch("--resume")
        assert [r["step"] for r in read_metrics(out)] == [0, 1]
        assert (out / "checkpoints" / "latest").read_text().strip() == "step_000002"


def test_questions_per_step_must_split_evenly_over_ranks():
    from ragrl.errors import ConfigError
    from ragrl.train.distributed import check_divisible

    check_divisible(4, 2)
    with pytest.raises(ConfigError, match="questions_per_step=3 must be a multiple of the number of processes"):
        check_divisible(3, 2)
