"""R1-Searcher protocol: queries as <|begin_of_query|> q <|end_of_query|>, documents as
<|begin_of_documents|> … <|end_of_documents|>, reasoning in <think>, the answer in <answer>.

As in R1-Searcher (Song et al., 2025, arXiv:2503.05592) the model searches *during* its
thinking, so a query block may sit inside <think> (it may also sit outside). The answer must
come after </think>. Parsing rules are Search-R1's (see ragrl.methods.search_r1) with these tags.
"""
from __future__ import annotations

from ragrl.methods.base import Method, register_method
from ragrl.methods.search_r1 import SearchR1Protocol
from ragrl.rewards.format import is_well_formed
from ragrl.rewards.qa import answer_of, f1_score, golds_of, protocol_of
from ragrl.rewards.search import retrieval_reward
from ragrl.rollout.protocol import TextProtocol

R1_SEARCHER_SYSTEM = """\
Answer the question. Think inside <think> </think>. While thinking, if you need a fact, write \
<|begin_of_query|> keywords <|end_of_query|>; documents come back inside \
<|begin_of_documents|> <|end_of_documents|>. Search as often as you need. After </think>, write \
<answer> a few words </answer> with no explanation.
Example:
Question: Who directed Jaws?
<think>I should look it up. <|begin_of_query|> Jaws film director <|end_of_query|>
<|begin_of_documents|>Doc 1 (Title: "Jaws (film)") Jaws is a 1975 film directed by Steven Spielberg.<|end_of_documents|>
The document says Steven Spielberg.</think>
<answer> Steven Spielberg </answer>"""


class R1SearcherProtocol(SearchR1Protocol):
    """R1-Searcher's special-token tags (plain text for tokenizers that lack them)."""

    name = "r1_searcher"
    query = ("<|begin_of_query|>", "<|end_of_query|>")
    observation = ("<|begin_of_documents|>", "<|end_of_documents|>")
    search_in_think = True
    obs_pad = "\n"
    system_prompt = R1_SEARCHER_SYSTEM


def r1_searcher_stage1_reward(completion, sample=None, protocol: str | TextProtocol | None = None) -> float:
    """R1-Searcher stage 1 (Song et al., 2025, arXiv:2503.05592): retrieve reward (0.5 if it
    searched at least once) + format reward (0.5 if well formed). No answer reward.

    >>> ok = "<think>a <|begin_of_query|> q <|end_of_query|>\\n<|begin_of_documents|>d<|end_of_documents|>\\nb</think><answer>x</answer>"
    >>> r1_searcher_stage1_reward(ok)
    1.0
    >>> r1_searcher_stage1_reward("<answer>x</answer>")
    0.5
    """
    proto = protocol_of(completion, protocol, default="r1_searcher")
    return retrieval_reward(completion, bonus=0.5, protocol=proto) + 0.5 * is_well_formed(completion, proto)


def r1_searcher_stage2_reward(
    completion, sample, penalty: float = 2.0, protocol: str | TextProtocol | None = None
) -> float:
    """R1-Searcher stage 2: answer F1, minus `penalty` (2 in the paper) if the format is wrong.

    >>> r1_searcher_stage2_reward("<think>x</think><answer>Paris France</answer>", {"answers": ["Paris"]})
    0.6666666666666666
    >>> r1_searcher_stage2_reward("<answer>Paris</answer> extra", {"answers": ["Paris"]})
    -1.0
    """
    proto = protocol_of(completion, protocol, default="r1_searcher")
    f1 = f1_score(answer_of(completion, proto), golds_of(completion, sample))
    return f1 - (0.0 if is_well_formed(completion, proto) else penalty)


METHOD = register_method(Method(
    name="r1_searcher",
    paper="R1-Searcher (Song et al., 2025, arXiv:2503.05592)",
    trains="the LM; stage 1 rewards retrieval + format, stage 2 answer F1 (REINFORCE++)",
    protocols=(R1SearcherProtocol,),
    rewards={"r1_searcher_stage1": r1_searcher_stage1_reward, "r1_searcher_stage2": r1_searcher_stage2_reward},
    answer_rewards=("r1_searcher_stage2",),
    recipes=("r1_searcher_stage1", "r1_searcher_stage2"),
))
