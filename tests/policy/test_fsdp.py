"""Parameter sharding (FSDP2) on two gloo ranks: the same step as one process with all rows,
each rank holding half of every weight, and checkpoints in the single-process format."""
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ragrl.policy.lm import LMPolicy
from ragrl.train.checkpoint import load_checkpoint, save_checkpoint
from ragrl.train.config import AlgoConfig, ModelConfig
from ragrl.policy.lm_model import build_policy
from ragrl.train.rng import seed_everything
from ragrl.train.update import ppo_update, prepare
from tests.train.test_distributed import HALVES, LENGTHS, SCORES, free_port, join_group
from tests.train.test_trainer import synthetic_batch

CASES = {  # name: (LoRA?, PPO value head?)
    "lora_grpo": (True, False),
    "full_ppo": (False, True),
}


def build(model_dir, lora: bool, value: bool):
    seed_everything(0)   # LoRA's A matrices and the value head come from the global RNG
    cfg = ModelConfig(name=str(model_dir), lora=lora, lora_r=8, lora_alpha=16, dtype="float32")
    return build_policy(cfg, with_value_head=value)


def step(model_dir, case: str, rows: slice, shard: bool):
    """One prepare + ppo_update on `rows` of the shared synthetic batch; returns (model, value
    head, optimizer). A small clip bound makes the gradient-norm clipping act."""
    from ragrl.policy.fsdp import shard_params

    lora, value = CASES[case]
    model, _, vh = build(model_dir, lora, value)
    batch = synthetic_batch(model, LENGTHS, SCORES).select(list(range(8))[rows])
    if shard:
        shard_params(model)
    cfg = AlgoConfig(estimator="gae" if value else "grpo", minibatch_size=8, micro_batch_size=3,
                     entropy_coef=0.01)
    # The optimizer is built over the sharded parameters before any forward, as the Trainer does.
    params = [p for p in model.parameters() if p.requires_grad] + (list(vh.parameters()) if vh else [])
    prep = prepare(LMPolicy(model, None, vh), batch, cfg, 0.0, cfg.micro_batch_size)
    # SGD with momentum: the step is linear in the gradient (Adam's first step, ~sign(g), would
    # amplify float noise), and the momentum buffer is optimizer state to checkpoint.
    opt = torch.optim.SGD(params, lr=0.5, momentum=0.9)
    model.train()
    ppo_update(LMPolicy(model, None, vh), opt, prep, cfg, 0.0, 0.05, torch.Generator().manual_seed(1))
    return model, vh, opt


def _rank_main(rank: int, world: int, port: int, model_dir: str, out_dir: str) -> None:
    from torch.distributed.tensor import DTensor

    from ragrl.policy.fsdp import full_optimizer_state, full_state_dict, shard_params

    join_group(rank, world, port)
    out = {}
    for case in CASES:
        model, vh, opt = step(model_dir, case, HALVES[rank], shard=True)
        weights = [p for p in model.parameters()]
        out[f"{case}.sharded_frac"] = (sum(p.to_local().numel() for p in weights if isinstance(p, DTensor))
                                       / sum(p.numel() for p in weights))
        state, opt_state = full_state_dict(model), full_optimizer_state(opt)
        out[f"{case}.state"] = state
        run = os.path.join(out_dir, case)
        if rank == 0:
            save_checkpoint(run, 1, model=model, optimizer=opt, model_state=state, optimizer_state=opt_state,
                            extra_modules={"value_head": vh} if vh else None)
        dist.barrier()
        # Resume on a fresh sharded model: every rank takes its shard of the saved tensors.
        model2, _, vh2 = build(model_dir, *CASES[case])
        shard_params(model2)
        params2 = [p for p in model2.parameters() if p.requires_grad] + (list(vh2.parameters()) if vh2 else [])
        opt2 = torch.optim.SGD(params2, lr=0.5, momentum=0.9)
        load_checkpoint(os.path.join(run, "checkpoints", "step_000001"), model=model2, optimizer=opt2,
                        extra_modules={"value_head": vh2} if vh2 else None)
        out[f"{case}.reloaded"] = full_state_dict(model2)
        out[f"{case}.reloaded_opt"] = full_optimizer_state(opt2)
        out[f"{case}.opt"] = opt_state
        out[f"{case}.moment_is_shard"] = all(isinstance(v, DTensor) for p in params2 if isinstance(p, DTensor)
                                             for v in [opt2.state[p]["momentum_buffer"]])
    torch.save(out, os.path.join(out_dir, f"fsdp.{rank}.pt"))
    dist.destroy_process_group()


def max_diff(a: dict, b: dict) -> float:
    assert sorted(a) == sorted(b)
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


@pytest.fixture(scope="module")
def fsdp_run(tiny_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("fsdp")
    mp.spawn(_rank_main, args=(2, free_port(), str(tiny_model_dir), str(out)), nprocs=2, join=True)
    return out, [torch.load(out / f"fsdp.{r}.pt", weights_only=False) for r in range(2)]


@pytest.mark.parametrize("case", list(CASES))
def test_sharded_ranks_take_the_step_one_process_takes_with_all_rows(tiny_model_dir, fsdp_run, case):
    _, ranks = fsdp_run
    init = build(tiny_model_dir, *CASES[case])[0].state_dict()
    single_model, _, _ = step(tiny_model_dir, case, slice(0, 8), shard=False)
    single = {k: v.detach() for k, v in single_model.state_dict().items()}
    assert max_diff(single, init) > 2e-4                      # a real step (clipped to norm 0.05)
    for r in ranks:
        assert max_diff(r[f"{case}.state"], single) < 2e-6
        # each rank stores about half of the weights (frozen LoRA base included)
        assert 0.45 < r[f"{case}.sharded_frac"] < 0.55


@pytest.mark.parametrize("case", list(CASES))
def test_a_sharded_checkpoint_resumes_sharded_or_on_one_process(tiny_model_dir, fsdp_run, case):
    out, ranks = fsdp_run
    for r in ranks:
        assert max_diff(r[f"{case}.reloaded"], r[f"{case}.state"]) == 0.0
        saved, back = r[f"{case}.opt"]["state"], r[f"{case}.reloaded_opt"]["state"]
        assert sorted(saved) == sorted(back) and len(saved) > 0
        assert all(torch.equal(saved[i]["momentum_buffer"], back[i]["momentum_buffer"]) for i in saved)
        assert r[f"{case}.moment_is_shard"]   # Adam/SGD state went back to its shard, not whole
    # The same files load into a plain single-process model: the format does not depend on sharding.
    model, _, vh = build(tiny_model_dir, *CASES[case])
    load_checkpoint(out / case / "checkpoints" / "step_000001", model=model, restore_rng=False,
                    extra_modules={"value_head": vh} if vh else None)
    assert max_diff({k: v.detach() for k, v in model.state_dict().items()}, ranks[0][f"{case}.state"]) == 0.0


def test_sharding_choices_follow_the_launcher_unless_set(monkeypatch):
    from ragrl.train.distributed import wants_sharded_optimizer, wants_sharded_params

    for k in ("ACCELERATE_USE_FSDP", "ACCELERATE_USE_DEEPSPEED"):
        monkeypatch.delenv(k, raising=False)
    assert not wants_sharded_params(None, 2) and not wants_sharded_optimizer(None, 2)
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    assert wants_sharded_params(None, 2) and not wants_sharded_params(None, 1)
    assert not wants_sharded_params(False, 2) and not wants_sharded_optimizer(None, 2)
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    assert wants_sharded_optimizer(None, 2) and not wants_sharded_optimizer(None, 2, params_sharded=True)
    assert not wants_sharded_optimizer(False, 2) and wants_sharded_optimizer(True, 2)
