"""SmartRAG's own settings: the `smartrag:` section of a recipe. `known_if` was `sft.known_if` until
2026-11-28; that key is still read, with a deprecation message."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ragrl.yaml_config import setting


@dataclass
class SmartRAGSettings:
    """What SmartRAG's SFT warm start (`sft.builder: smartrag`) counts as known."""

    known_if: Literal["em", "cover_em"] = setting("em", help=(
        "What counts as already right closed-book when the warm start decides between a direct "
        "answer and a search: exact match (em), or a gold answer contained in the reply (cover_em; "
        "for small models that answer in sentences)."))


MOVED_KEYS = {"sft.known_if": "known_if"}
