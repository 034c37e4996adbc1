"""Differences of the transformers API inside the range ragrl supports (>= 5.0).

transformers 5.2x renamed a model's `past_key_values` argument to `cache` and warns (a
FutureWarning on every forward) when the old name is used; 5.17, which the lent GPU machines
have, knows only the old one. Each call site passes the cache under the name its model takes.
"""
from __future__ import annotations

import functools
import inspect


@functools.cache
def _keyword_of(forward_owner: type) -> str:
    parameters = inspect.signature(forward_owner.forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"


def cache_keyword(module) -> str:
    """The name under which `module`'s forward takes its KV cache (a peft module: its base model's)."""
    base = module.get_base_model() if hasattr(module, "get_base_model") else module
    return _keyword_of(type(base))
