"""Parameter sharding (FSDP2, the ZeRO-3 layout): each rank stores 1/world of every weight.

`shard_params` wraps each decoder layer, then the whole model, with torch's `fully_shard`.
A layer's weights are all-gathered just before its forward (and again for its backward) and
freed after; gradients are reduce-scattered, so each rank also keeps only its share of the
gradients and of Adam's state (the optimizer is built over the sharded parameters).

Three places need more than the forward hooks:
  * Rollouts. Ranks generate different numbers of tokens, so per-layer all-gathers would not
    line up (a rank would wait forever). `full_params` gathers every weight once, in step, and
    keeps it gathered until generation ends: the "weight sync to the engine" of this design.
  * The update's forward. `forward_actions` runs the decoder and then the LM head on action
    positions only; under sharding the decoder must run through the root module's forward, or
    the root's weights (embeddings, final norm, a tied LM head) would never be gathered.
    `root_decoder_states` does that (the root's weights stay gathered until its backward).
  * Gradient sums. `update.py` divides each loss by the all-rank token count and expects the
    gradient *sum* over ranks (as `_sync_grads` does for replicated parameters); FSDP's default
    is the mean, so `shard_params` sets a divide factor of 1 with a plain SUM reduction (gloo
    has no pre-multiplied sum).

Checkpoints stay in the single-process format: `full_state_dict` and `full_optimizer_state`
gather the shards (collectives: every rank calls them), rank 0 writes; on load every rank reads
the full tensors and keeps its shard (`load_full_state_dict`, `shard_optimizer_state`). So a run
may resume on another number of ranks.
"""
from __future__ import annotations

import contextlib
import logging

import torch
from torch import nn

from ragrl.errors import ConfigError

log = logging.getLogger("ragrl.train")


def _fsdp():
    # Imported lazily: single-process runs never touch torch.distributed's FSDP machinery.
    from torch.distributed.fsdp import FSDPModule, fully_shard  # late: absent where torch.distributed is
    return FSDPModule, fully_shard


def is_sharded(model: nn.Module) -> bool:
    """Whether `shard_params` wrapped this model."""
    if not torch.distributed.is_available():
        return False
    return isinstance(model, _fsdp()[0])


def is_dtensor(t) -> bool:
    """Whether `t` is a shard-backed DTensor (an FSDP parameter or its gradient)."""
    if not torch.distributed.is_available():
        return False
    from torch.distributed.tensor import DTensor  # late: absent where torch.distributed is
    return isinstance(t, DTensor)


def fsdp_modules(model: nn.Module) -> list[nn.Module]:
    FSDPModule, _ = _fsdp()
    return [m for m in model.modules() if isinstance(m, FSDPModule)]


def _decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The transformer blocks: the longest ModuleList named `layers` / `h` / `blocks`."""
    best: list[nn.Module] = []
    for name, mod in model.named_modules():
        if isinstance(mod, nn.ModuleList) and name.rsplit(".", 1)[-1] in ("layers", "h", "blocks"):
            if len(mod) > len(best):
                best = list(mod)
    return best


def shard_params(model: nn.Module) -> nn.Module:
    """Shard `model` in place over the default process group: one unit per decoder layer plus
    the root (embeddings, final norm, LM head). Frozen weights (LoRA's base) are sharded too."""
    _, fully_shard = _fsdp()
    layers = _decoder_layers(model)
    if not layers:
        raise ConfigError(f"shard_params: found no decoder layers (a ModuleList named 'layers') in "
                          f"{type(model).__name__}; set shard_params: false")
    for layer in layers:
        fully_shard(layer)
    fully_shard(model)
    # The root's weights (embeddings, a tied LM head) stay gathered from its forward to its
    # backward: `forward_actions` applies the LM head after the root's forward has returned.
    model.set_reshard_after_forward(False, recurse=False)
    for m in fsdp_modules(model):
        m.set_gradient_divide_factor(1.0)
        m.set_force_sum_reduction_for_comms(True)
    log.info("parameters sharded over the process group (FSDP2): %d decoder layers + root", len(layers))
    return model


@contextlib.contextmanager
def full_params(model: nn.Module):
    """Inside: every weight is gathered on every rank, so ranks may run different numbers of
    forwards (generation). A no-op for an unsharded model. Every rank must enter it."""
    if not is_sharded(model):
        yield
        return
    mods = fsdp_modules(model)
    for m in mods:
        m.set_reshard_after_forward(False)
    for m in mods:
        m.unshard()
    try:
        yield
    finally:
        for m in mods:
            m.reshard()
            if m is not model:   # the root never reshards after forward (see shard_params)
                m.set_reshard_after_forward(True)


def reshard(model: nn.Module) -> None:
    """Free every gathered weight (a no-op unsharded). The root stays gathered after a forward
    run under no_grad, so `model.parameters()` would then hand out temporary full tensors."""
    if is_sharded(model):
        for m in fsdp_modules(model):
            m.reshard()


def root_decoder_states(model: nn.Module, decoder: nn.Module, **inputs) -> torch.Tensor:
    """The decoder's last hidden state [B, L, H], computed through the root module's forward
    (so FSDP gathers the root's weights); the LM head runs on one position only."""
    box: dict = {}

    def grab(_mod, _args, out):
        box["h"] = out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]

    handle = decoder.register_forward_hook(grab)
    try:
        model(**inputs, logits_to_keep=1)
    finally:
        handle.remove()
    return box["h"]


def _full(t):
    return t.full_tensor() if is_dtensor(t) else t


def local_nbytes(t: torch.Tensor) -> int:
    """Bytes this rank holds of `t`: its shard for a DTensor, all of it otherwise."""
    t = t.to_local() if is_dtensor(t) else t
    return t.numel() * t.element_size()


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's state dict with every shard gathered (a collective, in key order).
    Tied weights keep one entry per name, like `model.state_dict()` of the unsharded model."""
    return {k: _full(v).detach().cpu() for k, v in model.state_dict().items()}


def load_full_state_dict(model: nn.Module, state: dict[str, torch.Tensor], strict: bool = True) -> None:
    """Load full tensors into a sharded model: each rank keeps its own shard."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict  # late: as _fsdp
    # set_model_state_dict replaces the dict's values with shards: give it a copy.
    set_model_state_dict(model, dict(state), options=StateDictOptions(full_state_dict=True, strict=strict))


def full_optimizer_state(optimizer: torch.optim.Optimizer) -> dict:
    """optimizer.state_dict() with sharded moments gathered (a collective)."""
    sd = optimizer.state_dict()
    sd["state"] = {i: {k: _full(v).cpu() if torch.is_tensor(v) else v for k, v in st.items()}
                   for i, st in sd["state"].items()}
    return sd


def shard_optimizer_state(optimizer: torch.optim.Optimizer) -> None:
    """After `optimizer.load_state_dict(full_state)`: turn each full moment of a sharded
    parameter back into that rank's shard (Adam cannot mix a DTensor weight with a full moment)."""
    from torch.distributed.tensor import distribute_tensor  # late: as _fsdp
    for group in optimizer.param_groups:
        for p in group["params"]:
            if not is_dtensor(p):
                continue
            st = optimizer.state.get(p, {})
            for k, v in list(st.items()):
                if torch.is_tensor(v) and not is_dtensor(v) and v.shape == p.shape:
                    st[k] = distribute_tensor(v.to(p.device), p.device_mesh, p.placements)


def clip_grad_norm(params: list[torch.Tensor], max_norm: float) -> torch.Tensor:
    """Global L2 norm of the gradients and clipping to `max_norm`, for a mix of sharded
    (DTensor) and replicated gradients; the same coefficient as torch's clip_grad_norm_."""
    import torch.distributed as dist  # late: as _fsdp
    grads = [p.grad for p in params if p.grad is not None]
    device = grads[0].device if grads else torch.device("cpu")
    sharded = torch.zeros((), dtype=torch.float32, device=device)
    replicated = torch.zeros((), dtype=torch.float32, device=device)
    for g in grads:
        if is_dtensor(g):
            sharded += (g.to_local().float() ** 2).sum()
        else:
            replicated += (g.float() ** 2).sum()
    dist.all_reduce(sharded)   # each rank holds a disjoint share of the sharded gradients
    total = (sharded + replicated).sqrt()
    coef = min(1.0, max_norm / (float(total) + 1e-6))
    if coef < 1.0:
        for g in grads:
            g.mul_(coef)
    return total
