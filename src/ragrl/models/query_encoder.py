"""A trainable query encoder: the sentence-transformers model of a dense index, with gradients.

HARR trains only the *query* side of a dense retriever; passage vectors stay the index's.
This wraps a fresh (uncached, trainable) copy of the index's encoder, so queries are embedded
with the same tokenizer, pooling and L2 normalisation the passages were, and

    enc = QueryEncoder("all-minilm-l6-v2")        # any sentence-transformers name or folder
    q = enc(["who directed Jaws?"])               # [1, 384] float32, unit norm, with grad
    v = enc.encode(["who directed Jaws?"])        # numpy, no grad (rollouts, evaluation)

The module stays in eval mode while it trains: dropout would make the log-probs of the update
differ from the ones recorded at sampling time (PPO's ratio would not start at 1).
"""
from __future__ import annotations

import copy
import logging
import shutil
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ragrl.errors import ModelError
from ragrl.models.embedder import resolve_embedder

log = logging.getLogger("ragrl.models")

# BERT-family module names (MiniLM, MPNet, BGE, E5 …); LoRA on attention + MLP projections.
DEFAULT_LORA_TARGETS = ("query", "key", "value", "dense")


class QueryEncoder(nn.Module):
    def __init__(self, name: str, *, lora: bool = False, lora_r: int = 8, lora_alpha: int = 16,
                 lora_targets: tuple[str, ...] | list[str] = DEFAULT_LORA_TARGETS, max_length: int = 256):
        from peft import LoraConfig, get_peft_model  # late: peft takes ~3 s to import
        super().__init__()
        from sentence_transformers import SentenceTransformer  # late: heavy (~2 s); only dense retrieval needs it

        try:
            self.st = SentenceTransformer(resolve_embedder(name), device="cpu")
        except Exception as e:  # hub / file errors come in many types; all mean "cannot load"
            raise ModelError(f"cannot load query encoder {name!r} ({type(e).__name__}: {str(e)[:200]})") from None
        self.name = name
        self.st.max_seq_length = max_length
        self.lora = lora
        if lora:
            cfg = LoraConfig(r=lora_r, lora_alpha=lora_alpha, target_modules=list(lora_targets), lora_dropout=0.0)
            # peft injects the LoRA layers into the transformer in place, so the sentence-transformers
            # module keeps running (and holding) them. The wrapper is kept out of the module tree:
            # assigning it back would be shadowed by the `auto_model` property of recent
            # sentence-transformers, and its parameters would be registered twice.
            self._peft = [get_peft_model(self.st[0].auto_model, cfg)]
        self.eval()

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    @property
    def dim(self) -> int:
        get = getattr(self.st, "get_embedding_dimension", None) or self.st.get_sentence_embedding_dimension
        return int(get())

    def train(self, mode: bool = True) -> "QueryEncoder":
        # Always eval mode (no dropout): see the module docstring.
        return super().train(False)

    def forward(self, texts: list[str], chunk: int = 16) -> torch.Tensor:
        """Unit-norm embeddings [len(texts), dim] with gradients (float32).

        Texts are tokenized once, sorted by length and run in chunks of `chunk`, each cut to its
        own longest text: a batch padded to its longest would spend most of its compute on padding
        when short questions and long multi-hop histories are encoded together."""
        if not texts:
            return torch.zeros(0, self.dim, device=self.device)
        prep = getattr(self.st, "preprocess", None) or self.st.tokenize   # sentence-transformers >= 6 / < 6
        features = prep(list(texts))
        lengths = features["attention_mask"].sum(-1)
        order = torch.argsort(lengths, stable=True)
        parts = []
        for idx in order.split(chunk):
            width = int(lengths[idx].max())
            part = {k: (v[idx, :width].to(self.device) if isinstance(v, torch.Tensor) and v.dim() == 2 else v)
                    for k, v in features.items()}
            parts.append(self.st(part)["sentence_embedding"].float())
        by_length = torch.cat(parts)
        out = torch.empty_like(by_length).index_copy(0, order.to(self.device), by_length)   # back to input order
        return torch.nn.functional.normalize(out, dim=-1)

    @torch.no_grad()
    def encode(self, texts: list[str], batch_size: int = 32) -> np.ndarray:
        """Unit-norm embeddings [len(texts), dim] as float32 numpy, without gradients."""
        return self(list(texts), chunk=batch_size).cpu().numpy()

    def save_encoder(self, out_dir: str | Path) -> Path:
        """Write a plain sentence-transformers folder (LoRA merged): `ragrl eval --query-encoder`
        and `SentenceTransformer(out_dir)` load it with nothing from ragrl."""

        out_dir = Path(out_dir)
        tmp = out_dir.parent / f".tmp_{out_dir.name}"
        shutil.rmtree(tmp, ignore_errors=True)
        copied = copy.deepcopy(self)   # one deepcopy: the copy's peft wrapper holds the copy's layers
        if self.lora:
            copied._peft[0].merge_and_unload()   # merges into the copy's transformer in place
        copied.st.save(str(tmp))
        shutil.rmtree(out_dir, ignore_errors=True)
        tmp.rename(out_dir)
        return out_dir
