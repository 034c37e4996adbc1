"""`rollout.answer_by: start` (or `base`): the weights a run started from (or the base model, every
adapter off) write every answer (s3's frozen generator).

When a searcher and its reader share one LoRA adapter, a reward on what the searches found trains
the query turns and leaves the answer turn to drift with them (issue #53's candidate J: searches
better, F1 4 points worse). s3 trains only the searcher and answers with a frozen generator; here
the frozen generator is the policy the run started from (its SFT adapter, kept as the KL
`reference`; the base model for a run without one), so the searcher's training cannot move it.

`base` is for a warm start that reads badly: an SFT adapter taught on episodes that end in searches
can write its last query back as the answer (issue #53's candidate P: 37% of its start's answers on
`agent-confirm`), so F1 would then score the query's words, not what the passages let a reader say.

After the episodes are played, each turn that answered is cut just after its answer tag, and the
start (or base) writes the rest greedily, all of them in one batched `generate`. The policy's own answer
tokens are dropped; the start's are appended with action_mask 0 and log-prob 0, as an observation's
are (the policy did not write them, so no loss may credit it with them), and the turn is parsed
again: an answer the start leaves unclosed is a format error, as the policy's would be.

`reader` is s3's generator whole: a frozen model with a prompt of its own over what the searches
found, not a continuation of the searcher's transcript. The base model (every adapter off) reads the
episode's distinct passages, in the order they were shown, each cut to its snippet for the question as
naive RAG's are, with naive RAG's own prompt and answer budget, and its reply's first line is the
answer. Under `base` the continuation of the runner's answer opening ("The documents give the
answer.") is often that thought again (issue #53's candidate R: 69% of episodes); this reader is the
one naive RAG's row is scored with, shown the episode's passages instead of the question's top k. Its
reply is plain text, so it cannot make a format error: the episode's format errors are the policy's.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from ragrl.engines.base import Engine, SamplingParams
from ragrl.errors import ConfigError, RagrlError
from ragrl.models.agent_adapters import MERGED, adapters_off, peft_model, reference_context
from ragrl.rollout.baselines import BASELINE_ANSWER_TOKENS, baseline_answer, naive_rag_messages
from ragrl.rollout.protocol import TextProtocol, chat_ids
from ragrl.rollout.trajectory import EpisodeEnd, Trajectory


@dataclass
class AnsweringTurn:
    """An episode whose last turn answered, and where that turn starts in its ids."""

    traj: Trajectory
    turn_start: int          # index in traj.token_ids of the turn's first generated id
    opening: str = ""        # text the runner wrote in front of the turn (rollout.first_action)


def check_start_can_answer(engine: Engine, protocol: TextProtocol, writer: str = "start") -> None:
    """Refuse `answer_by: <writer>` where it cannot act, before any episode is played: a protocol with no
    answer tags, an engine with no LoRA module to switch (under `base` or `reader`, a plain model is the base
    already, unless an adapter was merged into it), or a compiled decode step (which would not see the
    switch)."""
    if getattr(protocol, "answer", None) is None:
        raise ConfigError(f"rollout.answer_by={writer}: protocol {protocol.name!r} has no answer tags for the "
                          f"{writer} to continue after; set rollout.answer_by=policy")
    module = getattr(engine, "model", None)
    peft = module is not None and hasattr(peft_model(module), "peft_config")
    if writer in ("base", "reader") and module is not None and not peft and not getattr(module, MERGED, False):
        pass   # no adapter at all: the model is the base, which answers as it is
    elif not peft:
        raise ConfigError(f"rollout.answer_by={writer} needs an engine over a LoRA (peft) policy, whose "
                          f"{writer} weights it switches to; this {type(engine).__name__} has none"
                          f"{' (its adapter was merged into the weights)' if getattr(module, MERGED, False) else ''} "
                          "(model.lora=true, model.engine=hf)")
    if getattr(engine, "compile_mode", "off") != "off":
        raise ConfigError(f"rollout.answer_by={writer} switches adapters between calls, which a compiled decode "
                          "step would not see: set model.engine=hf (or model.compile=off)")


def tag_end(tokenizer, ids: list[int], tag: str) -> int:
    """The fewest leading ids of `ids` whose text holds `tag` (the cut just after an answer tag).

    >>> from ragrl.models.lm_weights import SMOLLM2, load_tokenizer
    >>> tok = load_tokenizer(SMOLLM2)
    >>> ids = tok.encode("<think>x</think>\\n<answer> Paris </answer>", add_special_tokens=False)
    >>> tok.decode(ids[:tag_end(tok, ids, "<answer>")])
    '<think>x</think>\\n<answer>'
    """
    text = tokenizer.decode(ids, skip_special_tokens=False)
    if tag not in text:
        raise RagrlError(f"an answering turn holds no {tag!r}: {text[:200]!r}")
    for k in range(1, len(ids) + 1):   # a tag ends within the first few ids after its start: short scans
        if tag in tokenizer.decode(ids[:k], skip_special_tokens=False):
            return k
    return len(ids)


def answer_cut(tokenizer, turn: AnsweringTurn, opener: str) -> int:
    """Where `turn`'s ids are cut for another writer to answer: just after its answer tag, or where
    the turn starts if the runner opened it with that tag (rollout.last_action: answer)."""
    if turn.opening.endswith(opener):
        return turn.turn_start
    return turn.turn_start + tag_end(tokenizer, turn.traj.token_ids[turn.turn_start:], opener)


def answer_by_start(engine: Engine, protocol: TextProtocol, turns: list[AnsweringTurn], max_turn_tokens: int,
                    max_response_tokens: int, stats: dict, writer: str = "start") -> None:
    """Replace what follows the answer tag of each turn in `turns` with the greedy continuation of
    `writer` (`start`: the run's start; `base`: the base model, adapters off; see the module
    docstring); `stats` gains the tokens and time as generate's."""
    if not turns:
        return
    t0 = time.perf_counter()
    tok = engine.tokenizer
    opener, closer = protocol.answer
    cuts = [answer_cut(tok, t, opener) for t in turns]
    params = [SamplingParams(max_new_tokens=max(1, min(max_turn_tokens - (cut - t.turn_start),
                                                       max_response_tokens - (cut - t.traj.prompt_len))),
                             temperature=0.0, stop=[closer], n=1, seed=0)
              for t, cut in zip(turns, cuts)]
    with (adapters_off if writer == "base" else reference_context)(engine.model):
        generations = engine.generate([t.traj.token_ids[:cut] for t, cut in zip(turns, cuts)], params)
    for t, cut, (g, *_) in zip(turns, cuts, generations):
        traj = t.traj
        kept = t.opening + tok.decode(traj.token_ids[t.turn_start:cut], skip_special_tokens=False)
        del traj.token_ids[cut:], traj.action_mask[cut:], traj.logprobs[cut:]
        traj.append_masked(g.token_ids)
        # as the runner reads a turn: the text without the final EOS
        text = kept + (g.text or tok.decode(g.token_ids[:-1] if g.stop_reason == "eos" else g.token_ids,
                                            skip_special_tokens=False))
        action = protocol.parse(text)
        turn = traj.turns[-1]
        turn.action_text, turn.kind, turn.error = text, action.kind, action.error
        if action.kind == "answer":
            traj.answer = action.answer
        else:
            traj.answer = None
            traj.format_errors += 1
            traj.stop_reason = EpisodeEnd.NO_ANSWER
        stats["gen_tokens"] += len(g.token_ids)
    stats["generate_s"] += time.perf_counter() - t0


def answer_by_reader(engine: Engine, protocol: TextProtocol, turns: list[AnsweringTurn], passage_words: int,
                     stats: dict) -> None:
    """`rollout.answer_by: reader` (module docstring): the base model, adapters off, answers each turn's
    question from naive RAG's prompt over its episode's shown passages; the answer, then the
    protocol's closing tag, is appended masked after the turn's answer tag. `stats` gains the tokens
    and time as generate's."""
    if not turns:
        return
    t0 = time.perf_counter()
    tok = engine.tokenizer
    opener, closer = protocol.answer
    prompts = [chat_ids(tok, naive_rag_messages(t.traj.question, t.traj.shown_hits(), passage_words)) for t in turns]
    params = SamplingParams(max_new_tokens=BASELINE_ANSWER_TOKENS, temperature=0.0, stop=["\n"], n=1, seed=0)
    with adapters_off(engine.model):
        generations = engine.generate(prompts, params)
    for t, (g, *_) in zip(turns, generations):
        traj = t.traj
        cut = answer_cut(tok, t, opener)
        kept = t.opening + tok.decode(traj.token_ids[t.turn_start:cut], skip_special_tokens=False)
        reply = g.text or tok.decode(g.token_ids, skip_special_tokens=False)
        answer = baseline_answer(reply.replace(tok.eos_token or "<|im_end|>", ""))
        del traj.token_ids[cut:], traj.action_mask[cut:], traj.logprobs[cut:]
        traj.append_masked(tok.encode(f" {answer} {closer}", add_special_tokens=False))
        turn = traj.turns[-1]
        turn.action_text, turn.kind, turn.error = f"{kept} {answer} {closer}", "answer", None
        traj.answer = answer
        stats["gen_tokens"] += len(g.token_ids)
    stats["generate_s"] += time.perf_counter() - t0
