"""The SFT loop: fit the policy's LoRA adapter on warm-start episodes (ragrl.methods.synthetic and
the methods' own builders write them), masked so that only the policy's own tokens are learned.
"""
from __future__ import annotations

import logging
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from ragrl.policy.batch import collate
from ragrl.policy.lm_model import forward_actions
from ragrl.rollout.trajectory import Trajectory

log = logging.getLogger("ragrl.sft")


@dataclass
class SFTResult:
    losses: list[float]
    seconds: float
    adapter_dir: Path | None


def run_sft(model, tok, trajs: list[Trajectory], *, steps: int, batch_size: int, lr: float, seed: int,
            out_dir: Path | None = None, progress=None) -> SFTResult:
    """Masked next-token NLL on the action tokens of `trajs` for `steps` optimizer steps."""
    g = torch.Generator().manual_seed(seed)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 - s / max(1, steps))
    losses, t0, order, pos = [], time.perf_counter(), torch.randperm(len(trajs), generator=g), 0
    model.train()
    for step in range(steps):
        if pos + batch_size > len(order):
            order, pos = torch.randperm(len(trajs), generator=g), 0
        idx = order[pos: pos + batch_size].tolist()
        pos += batch_size
        batch = collate([trajs[i] for i in idx], tok.pad_token_id).to(params[0].device)
        out = forward_actions(model, batch.input_ids, batch.attention_mask, batch.action_mask)
        loss = -(out["logprobs"] * batch.action_mask).sum() / batch.action_mask.sum().clamp(min=1)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
        if progress:
            progress(step + 1, steps, losses[-1])
    model.eval()
    adapter_dir = None
    if out_dir is not None and hasattr(model, "save_pretrained"):
        adapter_dir = Path(out_dir) / "adapter"
        tmp = adapter_dir.with_name(".tmp_adapter")
        model.save_pretrained(tmp)
        if adapter_dir.exists():
            shutil.rmtree(adapter_dir)
        tmp.rename(adapter_dir)
    return SFTResult(losses, time.perf_counter() - t0, adapter_dir)
