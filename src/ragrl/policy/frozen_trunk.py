"""The frozen bottom of the decoder (its trunk), run once per update instead of once per forward.

With LoRA on the top `model.lora_layers` layers only, the embeddings and the layers below the lowest
adapter hold nothing trainable and nothing that switches: a row's hidden state entering the first
adapted layer is the same in every forward of an update (the reference's log-probs, the critic's old
values, each PPO epoch's pass). So the update runs those layers once per row with no graph
(`ragrl.policy.lm_model.trunk_states`, which stops the decoder after the trunk's last layer), keeps the
states, and every later forward runs only the layers above them (`top_layers_only`, fed the kept
states as the decoder's input embeddings). Under PPO with a critic, a KL reference and two
epochs, the bottom 22 of SmolLM2's 30 layers run once instead of four times (`benchmarks/frozen_trunk.py`).

`frozen_depth` decides how many layers that is, from what the model holds at the time: the first layer
with a trainable parameter, any LoRA adapter (the policy's, the frozen reference's, an MMOA-RAG
agent's) or a dropout, and 0 (nothing reused) with trainable embeddings, attention dropout, a decoder
without a `layers` list, or FSDP.
"""
from __future__ import annotations

import contextlib

import torch
from torch import nn

from ragrl.policy.fsdp import is_sharded


class _TrunkDone(Exception):
    """Raised by the hook on the trunk's last layer: the decoder's remaining layers are not run."""

    def __init__(self, states: torch.Tensor):
        super().__init__("frozen trunk captured")
        self.states = states


def decoder_layers(decoder: nn.Module) -> nn.ModuleList | None:
    """The decoder's list of layers (`.layers`, as every Hugging Face decoder-only LM names it), or None."""
    layers = getattr(decoder, "layers", None)
    return layers if isinstance(layers, nn.ModuleList) else None


def frozen_depth(model: nn.Module, decoder: nn.Module) -> int:
    """How many bottom layers of `decoder` (the body of `model`) compute the same thing in every
    forward of an update: those below the first layer holding a trainable parameter, a LoRA adapter or
    a dropout. 0 where nothing can be reused: trainable embeddings, attention dropout, no `layers` list,
    or FSDP-sharded weights."""
    layers = decoder_layers(decoder)
    if layers is None or is_sharded(model):
        return 0
    embed = decoder.get_input_embeddings() if hasattr(decoder, "get_input_embeddings") else None
    if embed is None or any(p.requires_grad for p in embed.parameters()):
        return 0
    # Attention dropout draws anew in every training forward: kept states would fix one draw.
    if float(getattr(getattr(decoder, "config", None), "attention_dropout", 0.0) or 0.0) > 0:
        return 0
    for i, layer in enumerate(layers):
        if (any(p.requires_grad for p in layer.parameters())
                or any(hasattr(m, "lora_A") or (isinstance(m, nn.Dropout) and m.p > 0) for m in layer.modules())):
            return i
    return len(layers)


@contextlib.contextmanager
def stop_after_trunk(decoder: nn.Module, depth: int):
    """Inside, a decoder call raises `_TrunkDone` carrying the states after its layer `depth - 1`
    ([B, L, H], before any later layer or the final norm): catch it with `trunk_output`."""
    layer = decoder_layers(decoder)[depth - 1]

    def hook(module, args, output):
        raise _TrunkDone(output[0] if isinstance(output, tuple) else output)

    handle = layer.register_forward_hook(hook)
    try:
        yield
    finally:
        handle.remove()


def trunk_output(call) -> torch.Tensor:
    """The states `call()` (a decoder call inside `stop_after_trunk`) stopped at."""
    try:
        call()
    except _TrunkDone as done:
        return done.states
    raise RuntimeError("the decoder returned without reaching the frozen trunk's last layer")


@contextlib.contextmanager
def top_layers_only(decoder: nn.Module, depth: int):
    """Inside, the decoder is its layers from `depth` up: fed the kept trunk states as its
    `inputs_embeds`, it runs only those layers (and its final norm). Their attention modules count
    their `layer_idx` from 0 meanwhile, so a KV cache built inside (the shared prefix's) holds them
    from its first slot, where the causal mask reads the cached length."""
    layers = decoder_layers(decoder)
    shifted = [(m, m.layer_idx) for layer in layers[depth:] for m in layer.modules()
               if isinstance(getattr(m, "layer_idx", None), int)]
    decoder.layers = nn.ModuleList(layers[depth:])
    for module, index in shifted:
        module.layer_idx = index - depth
    try:
        yield
    finally:
        decoder.layers = layers
        for module, index in shifted:
            module.layer_idx = index
