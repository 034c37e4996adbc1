"""The limits and options of one retrieval server, apart from the server itself.

The in-process retriever and the HTTP client mirror these limits, and training uses both; keeping
them here means training never imports the HTTP server (fastapi, starlette), which a GPU machine
without the web stack, or any install that only trains, need not have.
"""
from __future__ import annotations

from dataclasses import dataclass

from ragrl.errors import ConfigError


@dataclass
class ServerSettings:
    """Limits and options of one server (the client and InProcessRetriever mirror them)."""

    max_queries_per_request: int = 256
    max_topk: int = 100
    max_query_chars: int = 2048
    max_body_bytes: int = 1_000_000
    token: str | None = None  # bearer token for /retrieve; None = no auth
    default_topk: int = 3
    max_batch: int = 256  # micro-batcher: most queries merged into one index call
    max_wait_ms: float = 2.0  # micro-batcher: how long the first request waits for company
    body_timeout_s: float = 10.0  # a client that trickles its body longer than this gets 408

    def __post_init__(self) -> None:
        for name in ("max_queries_per_request", "max_topk", "max_query_chars", "max_body_bytes",
                     "default_topk", "max_batch"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"server setting {name} must be a positive integer, got {value!r}")
        if self.default_topk > self.max_topk:
            raise ConfigError(f"default_topk={self.default_topk} is larger than max_topk={self.max_topk}")
        if self.token is not None and not self.token.strip():
            raise ConfigError("server token is empty; pass a real token or none")
