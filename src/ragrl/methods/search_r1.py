"""Search-R1 protocol: <think>, <search> q </search>, <information> docs </information>, <answer> a </answer>.

This module also holds the tag machinery that rag_r1, r1_searcher and smartrag reuse: they
only change the tag strings, the prompt, and (rag_r1) how a search block splits into queries.

Parsing one generated turn (`parse`; the turn may end with a stop string or be cut at length):
  1. Tags match exactly (case-sensitive). Think tags outside an action block are free text.
  2. The action is the first complete block: an <answer>…</answer>, or a run of
     <search>…</search> blocks that starts before any <answer>; the LAST search of the run
     wins. Scanning stops at the chosen action: text after it is ignored by `parse`
     (several answers, or text after the answer, only make `is_valid_format` False).
  3. A block still open at the end of the turn → invalid "unclosed <search>" (or <answer>),
     unless a complete search came before it, which then stands.
  4. The same tag opened inside an open block → invalid "nested <search>"; any other tag
     inside it → "unclosed <search>". A close tag with no open one → "</search> without <search>".
  5. The model writing an observation tag (<information> or </information>) before its action
     is complete → invalid "the model wrote its own <information> block". Model text is never
     trusted as retrieved evidence (the loop keeps those tokens as the policy's own actions).
  6. Whitespace inside a block collapses to single spaces. An empty query → "empty query", an
     empty answer → "empty answer". A long query is cut to `max_query_chars`, a long answer to
     `max_answer_chars`; both stay valid.
  7. No action at all (only thinking) → invalid "no <search> or <answer>"; `parse` never returns
     "continue". Contract for the rollout loop: after EOS such a turn ends the episode with no
     answer (a format error); after a length cut the loop may feed back `format_feedback`.

`is_valid_format` checks the whole response against
    (think? (search information)*)* think? answer
with only whitespace outside the tags, non-empty search/answer blocks, <information> only right
after a search, nothing but whitespace (or an end-of-text marker) after the answer.
"""
from __future__ import annotations

import re

from ragrl.errors import ConfigError, RagrlError
from ragrl.methods.base import Method, register_method
from ragrl.retrieval.base import Hit
from ragrl.rewards.format import is_well_formed
from ragrl.rewards.qa import answer_of, exact_match, golds_of
from ragrl.rollout.protocol import Action, TextProtocol
from ragrl.rollout.snippets import format_hits, squash

# end-of-text markers a decoder may leave at the very end of a response
_END_MARKERS = ("<|im_end|>", "<|endoftext|>", "</s>")


# The worked example shows the episode shape the SFT warm start teaches (ragrl.train.sft): the
# first search is the question itself, and the answer follows the documents directly. With a
# keyword query here ("Jaws film director") the warm-started 135M policy wrote shortened keyword
# queries that BM25 answers worse, and copied the question in only 20 of 100 train-split dev
# questions (55 with this example and 160 SFT steps; dev F1 4.7 -> 9.1 and 7.5, two seeds).
SEARCH_R1_SYSTEM = """\
Answer the question. Think inside <think> </think>. To look something up, write \
<search> query </search>; results come back inside <information> </information>. \
Search as often as you need. When you know, write <answer> a few words </answer> with no explanation.
Example:
Question: Who directed Jaws?
<think>I need to search for this.</think>
<search> Who directed Jaws? </search>
<information>Doc 1 (Title: "Jaws (film)") Jaws is a 1975 film directed by Steven Spielberg.</information>
<answer> Steven Spielberg </answer>"""


class SearchR1Protocol(TextProtocol):
    """Search-R1 (Jin et al., 2025): one query per <search>, Search-R1's observation shape."""

    name = "search_r1"
    think: tuple[str, str] | None = ("<think>", "</think>")
    query = ("<search>", "</search>")
    answer = ("<answer>", "</answer>")
    observation = ("<information>", "</information>")
    search_in_think = False          # R1-Searcher issues queries inside its <think> block
    group_by_query = False           # rag_r1 always labels documents with their query
    obs_pad = "\n\n"                 # Search-R1 puts a blank line on each side of <information>
    system_prompt = SEARCH_R1_SYSTEM

    def __init__(self, max_query_chars: int = 512, max_answer_chars: int = 200):
        for key, value in (("max_query_chars", max_query_chars), ("max_answer_chars", max_answer_chars)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"{self.name}: {key} must be a positive integer, got {value!r}")
        self.max_query_chars = max_query_chars
        self.max_answer_chars = max_answer_chars
        self.stop_strings = [self.query[1], self.answer[1]]
        tags = [*self.query, *self.answer, *self.observation, *(self.think or ())]
        # longest first, so that a tag never matches as the prefix of a longer one
        self._tag_re = re.compile("|".join(re.escape(t) for t in sorted(tags, key=len, reverse=True)))

    # ---------------------------------------------------------------- prompt
    def messages(self, question: str) -> list[dict[str, str]]:
        if not isinstance(question, str) or not question.strip():
            raise RagrlError(f"{self.name}: the question must be a non-empty string, got {question!r}")
        return [
            {"role": "system", "content": self.system_prompt},
            {"role": "user", "content": f"Question: {question.strip()}"},
        ]

    # ----------------------------------------------------------------- parse
    def parse(self, text: str) -> Action:
        text = text if isinstance(text, str) else ("" if text is None else str(text))
        q_open, q_close = self.query
        a_open, a_close = self.answer
        open_tag, open_at = None, 0           # the action block being read, where its content starts
        searches: list[str] = []              # contents of the run of complete search blocks
        for m in self._tag_re.finditer(text):
            tag = m.group()
            if open_tag is None:
                if tag in self.observation:
                    if searches:
                        break
                    return Action("invalid", error=f"the model wrote its own {self.observation[0]} block")
                if tag == a_open and searches:
                    break                     # the search run came first: it is the action
                if tag in (q_open, a_open):
                    open_tag, open_at = tag, m.end()
                elif tag in (q_close, a_close):
                    if searches:
                        break
                    opener = q_open if tag == q_close else a_open
                    return Action("invalid", error=f"{tag} without {opener}")
                continue                      # think tags outside a block are free text
            closer = q_close if open_tag == q_open else a_close
            if tag == closer:
                content = text[open_at:m.start()]
                if open_tag == a_open:
                    return self._answer_action(content)
                searches.append(content)
                open_tag = None
            elif searches:
                break                         # a malformed tail after a complete search: the search stands
            elif tag in self.observation:
                return Action("invalid", error=f"the model wrote its own {self.observation[0]} block")
            elif tag == open_tag:
                return Action("invalid", error=f"nested {open_tag}")
            else:
                return Action("invalid", error=f"unclosed {open_tag}")
        if searches:
            return self._search_action(searches[-1])
        if open_tag is not None:
            return Action("invalid", error=f"unclosed {open_tag}")
        return Action("invalid", error=f"no {q_open} or {a_open}")

    def split_queries(self, content: str) -> list[str]:
        """The queries in one search block's content (one here; rag_r1 allows several)."""
        query = squash(content)[: self.max_query_chars].strip()
        return [query] if query else []

    def _search_action(self, content: str) -> Action:
        queries = self.split_queries(content)
        if not queries:
            return Action("invalid", error="empty query")
        return Action("search", queries=queries)

    def _answer_action(self, content: str) -> Action:
        answer = squash(content)[: self.max_answer_chars].strip()
        if not answer:
            return Action("invalid", error="empty answer")
        return Action("answer", answer=answer)

    # ----------------------------------------------------------- observation
    def format_observation(self, queries: list[str], hits: list[list[Hit]]) -> str:
        if len(queries) != len(hits):
            raise RagrlError(f"{self.name}: {len(queries)} queries but {len(hits)} hit lists")
        if len(hits) == 1 and not self.group_by_query:
            body = format_hits(hits[0])
        else:
            body = "\n".join(f"Query {i}: {q}\n{format_hits(h)}" for i, (q, h) in enumerate(zip(queries, hits), 1))
        open_, close = self.observation
        return f"{self.obs_pad}{open_}{body}{close}{self.obs_pad}"

    def format_feedback(self, error: str) -> str:
        open_, close = self.observation
        error = str(error).replace(close, "")  # the hint must stay inside one observation block
        hint = f"Use {self.query[0]} query {self.query[1]} or {self.answer[0]} answer {self.answer[1]}."
        return f"\n{open_}Invalid action: {error}. {hint}{close}\n"

    # ------------------------------------------------------- whole responses
    def action_text(self, response: str) -> str:
        """The response without observation blocks (an unclosed one runs to the end)."""
        open_, close = self.observation
        pieces, pos = [], 0
        while (start := response.find(open_, pos)) != -1:
            pieces.append(response[pos:start])
            end = response.find(close, start + len(open_))
            if end == -1:
                return "".join(pieces)
            pos = end + len(close)
        pieces.append(response[pos:])
        return "".join(pieces)

    def count_searches(self, response: str) -> int:
        """Complete, non-empty query blocks outside observations (a multi-query search counts once)."""
        actions = self.action_text(response)
        open_, close = self.query
        count, pos = 0, 0
        while (start := actions.find(open_, pos)) != -1:
            end = actions.find(close, start + len(open_))
            if end == -1:
                break
            count += bool(actions[start + len(open_):end].strip())
            pos = end + len(close)
        return count

    def has_tags(self, text: str) -> bool:
        """Whether the text holds any tag of this protocol (a protocol response, not plain text)."""
        return bool(self._tag_re.search(text))

    def extract_answer(self, text: str) -> str | None:
        """The first well-formed, non-empty answer block in the action text, or None."""
        if not isinstance(text, str):
            return None
        actions = self.action_text(text)
        a_open, a_close = self.answer
        start = None
        for m in self._tag_re.finditer(actions):
            tag = m.group()
            if tag == a_open:
                start = m.end()               # a second open restarts the block
            elif start is not None and tag == a_close:
                answer = squash(actions[start:m.start()])[: self.max_answer_chars].strip()
                if answer:
                    return answer
                start = None
            elif start is not None:
                start = None                  # another tag inside the block: not well formed
        return None

    def is_valid_format(self, response: str) -> bool:
        if not isinstance(response, str):
            return False
        text = response.rstrip()
        for marker in _END_MARKERS:
            if text.endswith(marker):
                text = text[: -len(marker)].rstrip()
        think_open, think_close = self.think or (None, None)
        q_open, q_close = self.query
        a_open, a_close = self.answer
        o_open, o_close = self.observation
        mode, in_think, pos = "free", False, 0   # free | query | answer | after_query | obs | done
        for m in self._tag_re.finditer(text):
            tag, gap = m.group(), text[pos:m.start()]
            pos = m.end()
            if mode == "obs":                    # documents may contain anything but the close tag
                if tag == o_close:
                    mode = "free"
                continue
            if mode in ("query", "answer"):
                if tag != (q_close if mode == "query" else a_close) or not gap.strip():
                    return False
                mode = "after_query" if mode == "query" else "done"
                continue
            if (gap.strip() and not in_think) or mode == "done":
                return False
            if mode == "after_query":
                if tag != o_open:
                    return False
                mode = "obs"
            elif tag == think_open and not in_think:
                in_think = True
            elif tag == think_close and in_think:
                in_think = False
            elif tag == q_open and (self.search_in_think or not in_think):
                mode = "query"
            elif tag == a_open and not in_think:
                mode = "answer"
            else:
                return False
        return mode == "done" and not text[pos:].strip()


def search_r1_format_reward(
    completion, sample, lambda_f: float = 0.2, protocol: str | TextProtocol | None = None
) -> float:
    """Search-R1's format-aware outcome reward (EM decides "correct"):

        correct and well formed → 1;  correct, bad format → 1 − λ_f;
        wrong, well formed      → λ_f;  wrong, bad format → 0.

    From Jin et al., "An Empirical Study on Reinforcement Learning for Reasoning-Search
    Interleaved LLM Agents" (arXiv:2505.15117), implemented in Search-R1's
    verl/utils/reward_score/qa_em_format.py, whose reference values are 1 / 0.8 / 0.2
    (λ_f = structure_format_score = 0.2). Search-R1 also has an optional retrieval bonus and a
    small score for a wrong, badly formed answer; both default to 0 here (use `gold_recall`).

    >>> s = {"answers": ["Paris"]}
    >>> search_r1_format_reward("<think>x</think><answer>Paris</answer>", s)
    1.0
    >>> search_r1_format_reward("<answer>Paris</answer> trailing", s)
    0.8
    >>> search_r1_format_reward("<answer>Rome</answer>", s)
    0.2
    """
    correct = exact_match(answer_of(completion, protocol), golds_of(completion, sample)) == 1.0
    well_formed = is_well_formed(completion, protocol)
    if correct:
        return 1.0 if well_formed else 1.0 - lambda_f
    return lambda_f if well_formed else 0.0


METHOD = register_method(Method(
    name="search_r1",
    paper="Search-R1 (Jin et al., 2025, arXiv:2503.09516)",
    trains="the LM that searches and answers, with <search>/<information>/<answer> tags",
    protocols=(SearchR1Protocol,),
    rewards={"search_r1_format": search_r1_format_reward},
    answer_rewards=("search_r1_format",),
    recipes=("search_r1_grpo", "search_r1_ppo"),
    default_text_protocol=True,   # a bare string handed to a reward is read in Search-R1's tags
))
