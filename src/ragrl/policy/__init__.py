"""The trainable policy seam: what PPO/GRPO need from a policy, whatever it is.

`LMPolicy` (a causal LM over action tokens) and `RetrieverPolicy` (a query encoder over
Plackett–Luce draws of documents) both satisfy `Policy` (policy/base.py); the update phase,
checkpoints, metrics and distributed code take a Policy and never ask which one it is.
"""
from ragrl.policy.base import ActionBatch, Policy

__all__ = ["ActionBatch", "Policy"]
