"""A tiny randomly initialised Llama with SmolLM2's tokenizer, for fast tests of mechanics.

Same vocabulary (49152) and chat template as SmolLM2, so every prompt, protocol and stop string
works unchanged; ~3.3M parameters (almost all in the tied embedding), so a training step takes
about a second on one CPU core. Its outputs are noise; use it to test plumbing, never quality.
"""
from __future__ import annotations

from pathlib import Path

import torch
import transformers  # transformers.LlamaForCausalLM: the model code loads on first use, not on import

from ragrl.models.lm_weights import SMOLLM2, load_tokenizer


def make_tiny_model(
    out_dir: str | Path | None = None, *, hidden: int = 64, layers: int = 2, heads: int = 4, seed: int = 0
):
    """(LlamaForCausalLM, tokenizer), identical weights for identical arguments.

    With `out_dir`, model and tokenizer are also saved there, so `load_policy(out_dir)` works.
    """

    tokenizer = load_tokenizer(SMOLLM2)
    config = transformers.LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=4 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 2),  # grouped-query attention, like SmolLM2
        max_position_embeddings=8192,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    # A private RNG stream: the same seed gives the same weights, and the caller's global
    # torch RNG state is left exactly as it was.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = transformers.LlamaForCausalLM(config)
    model.eval()
    if out_dir is not None:
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(out_dir)
        tokenizer.save_pretrained(out_dir)
    return model, tokenizer
