"""SmartRAG protocol: each step is one bracketed action, no free-form reasoning.

SmartRAG (Gao et al., ICLR 2025) trains one policy to decide when to retrieve, to rewrite the
query, and to answer. Here each step the policy writes exactly one of

    [Search] rewritten query [/Search]
    [Answer] a few words [/Answer]

and a search is answered with `\\n[Documents]Doc 1 (Title: "T") text ...[/Documents]\\n`.
The close markers are the stop strings (a step ends there or at EOS) but optional when parsing:
as in the released code, the first word decides the action. There is no think block. An invalid
step ends the episode. The retrieval quota is the rollout's `max_searches`; the retrieval cost
is the `smartrag` reward's `cost`.
"""
from __future__ import annotations

from ragrl.methods.search_r1 import SearchR1Protocol
from ragrl.rollout.protocol import Action

SMARTRAG_SYSTEM = """\
Answer the question. Each step, write exactly one line: [Search] query [/Search] to look \
something up (documents come back inside [Documents] [/Documents]), or [Answer] a few words [/Answer] \
when you know. Search only when you need to.
Example:
Question: Who directed Jaws?
[Search] Jaws film director [/Search]
[Documents]Doc 1 (Title: "Jaws (film)") Jaws is a 1975 film directed by Steven Spielberg.[/Documents]
[Answer] Steven Spielberg [/Answer]"""


class SmartRAGProtocol(SearchR1Protocol):
    """SmartRAG's one-action-per-step format, parsed by its first word as the released code does.

    A step is `[Search] query` or `[Answer] answer` (the close marker is optional: it is also the
    stop string, and an EOS ends a step just as well). Anything else, two actions in one step, or
    the model writing its own [Documents], is a format error that ENDS the episode
    (`invalid_ends_episode`): SmartRAG gives no second chance, the reward's penalty pays for it.
    The retrieval quota is the rollout's `max_searches` (a search past it is a format error).
    """

    name = "smartrag"
    think = None
    query = ("[Search]", "[/Search]")
    answer = ("[Answer]", "[/Answer]")
    observation = ("[Documents]", "[/Documents]")
    obs_pad = "\n"
    system_prompt = SMARTRAG_SYSTEM
    invalid_ends_episode = True

    def parse(self, text: str) -> Action:
        """The step's action, by its first word.

        >>> p = SmartRAGProtocol()
        >>> p.parse("[Search] Jaws director")
        Action(kind='search', queries=['Jaws director'], answer=None, error=None)
        >>> p.parse(" [Answer] Spielberg [/Answer]").answer
        'Spielberg'
        >>> p.parse("[Search] Jaws [Answer] Spielberg").error
        'two actions in one step'
        """
        text = text if isinstance(text, str) else ("" if text is None else str(text))
        body = text.strip()
        for marker, close, kind in ((self.query[0], self.query[1], "search"), (self.answer[0], self.answer[1], "answer")):
            if not body.startswith(marker):
                continue
            content = body[len(marker):]
            if content.rstrip().endswith(close):
                content = content.rstrip()[: -len(close)]
            if any(t in content for t in (*self.observation,)):
                return Action("invalid", error=f"the model wrote its own {self.observation[0]} block")
            if any(t in content for t in (*self.query, *self.answer)):
                return Action("invalid", error="two actions in one step")
            return self._search_action(content) if kind == "search" else self._answer_action(content)
        if self.observation[0] in body or self.observation[1] in body:
            return Action("invalid", error=f"the model wrote its own {self.observation[0]} block")
        return Action("invalid", error=f"a step must start with {self.query[0]} or {self.answer[0]}")

    def steps(self, response: str) -> list[str]:
        """The action texts of a whole response, observations removed (one per step)."""
        o_open, o_close = self.observation
        steps, pos = [], 0
        while (start := response.find(o_open, pos)) != -1:
            steps.append(response[pos:start])
            end = response.find(o_close, start)
            if end == -1:
                return steps
            pos = end + len(o_close)
        steps.append(response[pos:])
        return [s for s in steps if s.strip()]

    def count_searches(self, response: str) -> int:
        return sum(self.parse(_strip_end(s)).kind == "search" for s in self.steps(response))

    def extract_answer(self, text: str) -> str | None:
        if not isinstance(text, str):
            return None
        for step in self.steps(text):
            action = self.parse(_strip_end(step))
            if action.kind == "answer":
                return action.answer
        return None

    def is_valid_format(self, response: str) -> bool:
        """Every step one valid action; searches, then exactly one answer, last."""
        if not isinstance(response, str):
            return False
        actions = [self.parse(_strip_end(s)) for s in self.steps(response)]
        return (bool(actions) and actions[-1].kind == "answer"
                and all(a.kind == "search" for a in actions[:-1]))


def _strip_end(text: str) -> str:
    text = text.strip()
    for marker in ("<|im_end|>", "<|endoftext|>", "</s>"):
        if text.endswith(marker):
            text = text[: -len(marker)].strip()
    return text
