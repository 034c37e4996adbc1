"""The six methods, one unit each. Importing this package registers every method's record
(ragrl.methods.base.Method) and so fills the core's registries.

| method      | module                 | trains                                  |
|-------------|------------------------|-----------------------------------------|
| Search-R1   | methods/search_r1.py   | the LM (PPO, GRPO)                      |
| R1-Searcher | methods/r1_searcher.py | the LM in two stages (REINFORCE++)      |
| RAG-R1      | methods/rag_r1.py      | the LM, several queries a search (PPO)  |
| SmartRAG    | methods/smartrag/      | the LM, SFT then PPO with a search cost |
| MMOA-RAG    | methods/mmoa/          | three agents of one LM (MAPPO)          |
| HARR        | methods/harr/          | the query encoder (GRPO, PPO)           |
"""
from ragrl.methods import lm_setup, synthetic  # noqa: F401  (the core's `lm` setup and `gold_search` builder)
from ragrl.methods import harr, mmoa, r1_searcher, rag_r1, search_r1, smartrag  # noqa: F401  (registers them)
from ragrl.methods.base import (METHODS, POLICY_SETUPS, SFT_BUILDERS, Method, Setup, register_method,
                                unregister_method)

__all__ = ["METHODS", "POLICY_SETUPS", "SFT_BUILDERS", "Method", "Setup", "register_method", "unregister_method"]
