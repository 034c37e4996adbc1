"""`rollout.answer_by: start` (`base`, `reader`): the frozen start (the base model; the base model
reading the episode's passages with naive RAG's prompt) writes each answer after the policy's answer tag.

A tiny Llama under two real LoRA adapters (the policy's `default` and a `reference` with other
weights, as a warm-started run holds them) and a real BM25 index. The policy's turns are scripted
(a random model writes no tags); the start's continuation is the real model's under `reference`, or
scripted to test a closed answer.
"""
from __future__ import annotations

import pytest
import torch

from ragrl.engines.base import SamplingParams
from ragrl.engines.hf import HFEngine
from ragrl.errors import ConfigError, ModelError
from ragrl.methods.search_r1 import SearchR1Protocol
from ragrl.models.agent_adapters import REFERENCE_ADAPTER, load_adapters
from ragrl.models.lm_weights import load_policy
from ragrl.rollout.config import RolloutConfig
from ragrl.rollout.multi_turn import run_episodes
from ragrl.retrieval.base import Hit
from ragrl.rollout.baselines import BASELINE_ANSWER_TOKENS, baseline_answer, naive_rag_messages
from ragrl.rollout.protocol import chat_ids
from ragrl.rollout.snippets import snippet
from ragrl.rollout.start_answers import check_start_can_answer
from ragrl.rollout.trajectory import EpisodeEnd

from tests.rollout.scripted import ScriptedEngine, spans

POLICY_TURNS = ["<think>find it</think>\n<search> Jaws director </search>",
                "<think>got it</think>\n<answer> policy words </answer>"]


@pytest.fixture()
def two_adapters(tiny_model_dir):
    """The tiny model under a `default` adapter (B = 0: the base) and a `reference` one with random B."""
    from peft import LoraConfig, get_peft_model

    base, tok = load_policy(str(tiny_model_dir))
    lora = dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    model = get_peft_model(base, LoraConfig(**lora))
    model.add_adapter(REFERENCE_ADAPTER, LoraConfig(**lora))
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if f"lora_B.{REFERENCE_ADAPTER}" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 2.0)
    model.set_adapter("default")
    return model, tok


class PolicyScriptedStartReal(ScriptedEngine):
    """Scripted policy turns; under the `reference` adapter, the real model decodes (or, with
    `start_scripted`, the script's next turn plays). Records the adapter active at each call."""

    def __init__(self, model, tok, scripts, start_scripted=False):
        super().__init__(tok, SearchR1Protocol(), scripts)
        self.model, self.real, self.start_scripted = model, HFEngine(model, tok), start_scripted
        self.adapters: list[str] = []

    def generate(self, prompts, params):
        self.adapters.append(self.model.active_adapter)
        if self.model.active_adapter == REFERENCE_ADAPTER and not self.start_scripted:
            return self.real.generate(prompts, params)
        return super().generate(prompts, params)


def _cfg(**kw) -> RolloutConfig:
    return RolloutConfig(**{"temperature": 0.0, "max_turns": 3, "max_turn_tokens": 24, "answer_by": "start", **kw})


def test_the_start_continues_after_the_answer_tag_exactly_as_its_own_greedy_decode(two_adapters, index):
    model, tok = two_adapters
    engine = PolicyScriptedStartReal(model, tok, {"Who directed Jaws?": list(POLICY_TURNS)})
    (traj,), _ = run_episodes(engine, SearchR1Protocol(), index, [{"id": "q", "question": "Who directed Jaws?",
                                                                   "answers": ["Steven Spielberg"]}], _cfg())
    assert engine.adapters == ["default", "default", REFERENCE_ADAPTER]
    assert model.active_adapter == "default"            # switched back for the trainer
    # the policy wrote the turn through its answer tag (trained, mask 1); the start the rest (mask 0)
    (_, b, e), (last_value, _, _) = [r for r in spans(traj.action_mask, traj.prompt_len)][-2:]
    assert tok.decode(traj.token_ids[b:e]) == "<think>got it</think>\n<answer>" and last_value == 0
    assert traj.logprobs[e:] == [0.0] * (len(traj.token_ids) - e)
    # ...exactly the start's own greedy decode from the same prefix, with the budget the turn had left
    model.set_adapter(REFERENCE_ADAPTER)
    expected = HFEngine(model, tok).generate([traj.token_ids[:e]], SamplingParams(
        max_new_tokens=24 - (e - b), temperature=0.0, stop=["</answer>"]))[0][0]
    model.set_adapter("default")
    assert expected.token_ids and traj.token_ids[e:] == expected.token_ids
    # a random start leaves the answer unclosed within the budget: the policy's answer is gone, a format error
    turn = traj.turns[-1]
    assert turn.action_text.startswith("<think>got it</think>\n<answer>") and "policy words" not in turn.action_text
    assert turn.kind == "invalid" and traj.answer is None and traj.format_errors == 1
    assert traj.stop_reason == EpisodeEnd.NO_ANSWER


def test_a_closed_start_answer_replaces_the_policys_and_only_answering_episodes_are_continued(two_adapters, index):
    model, tok = two_adapters
    scripts = {"Who directed Jaws?": [*POLICY_TURNS, " Steven Spielberg </answer>"],
               "Where is Paris?": ["<think>hm</think>", ("", "eos")]}    # no answer: the start writes nothing
    engine = PolicyScriptedStartReal(model, tok, scripts, start_scripted=True)
    samples = [{"id": "a", "question": "Who directed Jaws?", "answers": ["Steven Spielberg"]},
               {"id": "b", "question": "Where is Paris?", "answers": ["France"]}]
    (jaws, paris), stats = run_episodes(engine, SearchR1Protocol(), index, samples, _cfg())
    assert jaws.answer == "Steven Spielberg" and jaws.stop_reason == EpisodeEnd.ANSWER and jaws.format_errors == 0
    assert jaws.turns[-1].action_text == "<think>got it</think>\n<answer> Steven Spielberg </answer>"
    start_ids = tok.encode(" Steven Spielberg </answer>", add_special_tokens=False)
    assert jaws.token_ids[-len(start_ids):] == start_ids and jaws.action_mask[-len(start_ids):] == [0] * len(start_ids)
    assert jaws.action_mask[-len(start_ids) - 1] == 1            # the policy's last id: its answer tag
    assert paris.answer is None and paris.stop_reason != EpisodeEnd.ANSWER
    # one batched call for the start, holding the one answering episode only
    assert engine.adapters.count(REFERENCE_ADAPTER) == 1 and len(engine.calls[-1][0]) == 1
    assert stats["gen_tokens"] >= len(start_ids)


def test_answer_by_start_is_refused_where_it_cannot_act(two_adapters, index, tiny_model_dir):
    model, tok = two_adapters
    sample = [{"id": "q", "question": "Who directed Jaws?", "answers": ["x"]}]

    untagged = SearchR1Protocol()
    untagged.answer = None     # a protocol whose answers carry no tags
    with pytest.raises(ConfigError, match="has no answer tags"):
        run_episodes(PolicyScriptedStartReal(model, tok, {}), untagged, index, sample, _cfg())
    bare, _ = load_policy(str(tiny_model_dir))
    with pytest.raises(ConfigError, match="needs an engine over a LoRA"):
        run_episodes(HFEngine(bare, tok), SearchR1Protocol(), index, sample, _cfg())


def test_an_exported_adapter_without_its_frozen_start_is_refused(two_adapters, tiny_model_dir, tmp_path):
    model, tok = two_adapters
    model.save_pretrained(tmp_path / "with")
    assert (tmp_path / "with" / REFERENCE_ADAPTER / "adapter_config.json").is_file()
    loaded = load_adapters(load_policy(str(tiny_model_dir))[0], tmp_path / "with", with_start=True)
    assert set(loaded.peft_config) == {"default", REFERENCE_ADAPTER} and loaded.active_adapter == "default"
    model.delete_adapter(REFERENCE_ADAPTER)
    model.save_pretrained(tmp_path / "without")
    with pytest.raises(ModelError, match="holds no frozen start"):
        load_adapters(load_policy(str(tiny_model_dir))[0], tmp_path / "without", with_start=True)


def test_a_forced_last_turn_is_written_by_the_start_alone(two_adapters, index):
    """`rollout.last_action: answer` with `answer_by: start`: the policy searched twice and the episode
    reached its last turn; the runner writes the answer opening and the start the answer, in one
    batched call: the policy generates nothing in that turn and is credited with none of it."""
    model, tok = two_adapters
    searches = ["<think>a</think>\n<search> Jaws director </search>", "<think>b</think>\n<search> Jaws 1975 </search>"]
    scripts = {"Who directed Jaws?": [*searches, " Steven Spielberg </answer>"]}
    engine = PolicyScriptedStartReal(model, tok, scripts, start_scripted=True)
    protocol = SearchR1Protocol()
    (traj,), _ = run_episodes(engine, protocol, index, [{"id": "a", "question": "Who directed Jaws?",
                                                        "answers": ["Steven Spielberg"]}], _cfg(last_action="answer"))
    assert engine.adapters == ["default", "default", REFERENCE_ADAPTER]     # no third policy turn
    assert traj.num_turns == 3 and traj.num_searches == 2 and traj.format_errors == 0
    assert traj.answer == "Steven Spielberg" and traj.stop_reason == EpisodeEnd.ANSWER
    turn_text = protocol.answer_opening() + " Steven Spielberg </answer>"
    assert traj.turns[-1].action_text == turn_text and traj.turns[-1].kind == "answer"
    tail = tok.encode(protocol.answer_opening(), add_special_tokens=False) + \
        tok.encode(" Steven Spielberg </answer>", add_special_tokens=False)
    assert traj.token_ids[-len(tail):] == tail and traj.action_mask[-len(tail):] == [0] * len(tail)
    # the policy is credited with its two searches' ids and nothing else
    assert sum(traj.action_mask) == sum(len(tok.encode(t, add_special_tokens=False)) for t in searches)


def test_a_forced_last_answer_is_refused_where_it_cannot_act(two_adapters, index):
    model, tok = two_adapters
    sample = [{"id": "q", "question": "Who directed Jaws?", "answers": ["x"]}]
    with pytest.raises(ConfigError, match="leaves no turn to search"):
        run_episodes(PolicyScriptedStartReal(model, tok, {}), SearchR1Protocol(), index, sample,
                     RolloutConfig(max_turns=1, last_action="answer"))
    untagged = SearchR1Protocol()
    untagged.answer = None
    with pytest.raises(ConfigError, match="has no tagged answer for its policy to open"):
        run_episodes(PolicyScriptedStartReal(model, tok, {}), untagged, index, sample,
                     RolloutConfig(max_turns=2, last_action="answer"))


def test_answer_by_base_continues_as_the_base_model_with_every_adapter_off(two_adapters, index, tiny_model_dir):
    """`answer_by: base`: neither the policy's adapter nor the frozen start writes the answer but the
    base model, adapters off. The policy's `default` adapter is given random weights so that it differs
    from the base; peft's disable_adapter leaves the active adapter's name as it was, so the engine
    tells which weights computed each call by comparing a probe's logits with the bare model's."""
    model, tok = two_adapters
    with torch.no_grad():   # a policy adapter unlike the base, so a policy-written answer would differ
        gen = torch.Generator().manual_seed(1)
        for name, p in model.named_parameters():
            if "lora_B.default" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 2.0)
    calls: list[bool] = []     # per generate call: whether every adapter was off
    probe = tok.encode("Who", add_special_tokens=False)

    class Recording(PolicyScriptedStartReal):
        def generate(self, prompts, params):
            with torch.no_grad():
                now = model(torch.tensor([probe])).logits
            base_logits = bare(torch.tensor([probe])).logits
            calls.append(bool(torch.allclose(now, base_logits, atol=1e-5)))
            if calls[-1]:
                return self.real.generate(prompts, params)
            return super().generate(prompts, params)

    bare, _ = load_policy(str(tiny_model_dir))
    engine = Recording(model, tok, {"Who directed Jaws?": list(POLICY_TURNS)})
    (traj,), _ = run_episodes(engine, SearchR1Protocol(), index, [{"id": "q", "question": "Who directed Jaws?",
                                                                   "answers": ["x"]}], _cfg(answer_by="base"))
    assert calls == [False, False, True] and model.active_adapter == "default"
    with torch.no_grad():   # the adapters are on again after the answer: the trainer's policy is intact
        assert not torch.allclose(model(torch.tensor([probe])).logits, bare(torch.tensor([probe])).logits, atol=1e-5)
    (_, b, e), _ = [r for r in spans(traj.action_mask, traj.prompt_len)][-2:]
    expected = HFEngine(bare, tok).generate([traj.token_ids[:e]], SamplingParams(
        max_new_tokens=24 - (e - b), temperature=0.0, stop=["</answer>"]))[0][0]
    assert expected.token_ids and traj.token_ids[e:] == expected.token_ids


def test_answer_by_base_is_refused_over_a_merged_adapter_but_a_bare_model_is_its_own_base(two_adapters, index,
                                                                                         tiny_model_dir, tmp_path):
    """A merged adapter cannot be switched off, so `base` would read with the trained weights: refused.
    A model with no adapter at all is the base (a run's start from the base model): accepted."""
    model, tok = two_adapters
    model.delete_adapter(REFERENCE_ADAPTER)
    model.save_pretrained(tmp_path / "a")
    merged = load_adapters(load_policy(str(tiny_model_dir))[0], tmp_path / "a", merge=True)
    with pytest.raises(ConfigError, match="answer_by=base needs .* adapter was merged"):
        check_start_can_answer(HFEngine(merged, tok), SearchR1Protocol(), "base")
    with pytest.raises(ConfigError, match="answer_by=start needs .* adapter was merged"):
        check_start_can_answer(HFEngine(merged, tok), SearchR1Protocol(), "start")
    bare, _ = load_policy(str(tiny_model_dir))
    check_start_can_answer(HFEngine(bare, tok), SearchR1Protocol(), "base")
    with pytest.raises(ConfigError, match="answer_by=start needs an engine over a LoRA"):
        check_start_can_answer(HFEngine(bare, tok), SearchR1Protocol(), "start")


def test_answer_by_reader_is_the_base_model_reading_the_episodes_passages_with_naive_rags_prompt(
        two_adapters, index, tiny_model_dir):
    """`answer_by: reader`: once the policy's searches are spent, the base model (adapters off) answers
    from naive RAG's prompt over the episode's distinct passages, in the order shown and cut to their
    snippets; its first line is the answer, appended masked and closed, and it makes no format error
    (a random base writes no closing tag, which under `base` is one)."""
    model, tok = two_adapters
    with torch.no_grad():   # a policy adapter unlike the base
        gen = torch.Generator().manual_seed(1)
        for name, p in model.named_parameters():
            if "lora_B.default" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 2.0)
    bare, _ = load_policy(str(tiny_model_dir))
    probe = tok.encode("Who", add_special_tokens=False)
    seen: list[tuple[bool, list[list[int]]]] = []     # per call: every adapter off?, its prompts

    class Recording(PolicyScriptedStartReal):
        def generate(self, prompts, params):
            with torch.no_grad():
                off = bool(torch.allclose(model(torch.tensor([probe])).logits, bare(torch.tensor([probe])).logits,
                                          atol=1e-5))
            seen.append((off, [list(p) for p in prompts]))
            return self.real.generate(prompts, params) if off else super().generate(prompts, params)

    question = "Who directed Jaws?"
    searches = ["<think>a</think>\n<search> Jaws director </search>", "<think>b</think>\n<search> shark film </search>"]
    engine = Recording(model, tok, {question: searches, "Where is Paris?": ["<think>hm</think>", ("", "eos")]})
    cfg = _cfg(answer_by="reader", last_action="answer", passage_words=12)
    (traj, unanswered), stats = run_episodes(engine, SearchR1Protocol(), index, [
        {"id": "q", "question": question, "answers": ["x"]}, {"id": "p", "question": "Where is Paris?", "answers": ["y"]}],
        cfg)
    assert [off for off, _ in seen] == [False, False, True] and model.active_adapter == "default"
    # the reader's one call holds the one answering episode, and its prompt is naive RAG's own
    (_, (reader_prompt,)) = seen[-1]
    hits = traj.shown_hits()
    assert [h.id for h in hits] == [pid for pid, _ in traj.shown_passages()] and len(hits) > 3
    first = index.search(["Jaws director"], cfg.topk)[0]
    assert [(h.title, h.text) for h in hits[:len(first)]] == [(h.title, h.text) for h in first]
    cut = [Hit(id=h.id, title=h.title, text=snippet(h.text, question, 12), score=0.0) for h in hits]
    assert reader_prompt == chat_ids(tok, naive_rag_messages(question, cut))
    # its answer is the base's greedy reply's first line, closed and masked; the policy wrote none of it
    reply = HFEngine(bare, tok).generate([reader_prompt], SamplingParams(
        max_new_tokens=BASELINE_ANSWER_TOKENS, temperature=0.0, stop=["\n"]))[0][0]
    expected = baseline_answer(reply.text.replace("<|im_end|>", ""))
    assert traj.answer == expected and traj.format_errors == 0 and traj.stop_reason == EpisodeEnd.ANSWER
    tail = tok.encode(f" {expected} </answer>", add_special_tokens=False)
    assert traj.token_ids[-len(tail):] == tail and traj.action_mask[-len(tail):] == [0] * len(tail)
    assert sum(traj.action_mask) == sum(len(tok.encode(t, add_special_tokens=False)) for t in searches)
    assert traj.turns[-1].kind == "answer" and traj.turns[-1].action_text.endswith(f" {expected} </answer>")
    assert unanswered.answer is None and unanswered.stop_reason != EpisodeEnd.ANSWER
    assert stats["gen_tokens"] >= len(reply.token_ids)
    # a bare model is its own base; a merged adapter cannot be switched off
    check_start_can_answer(HFEngine(bare, tok), SearchR1Protocol(), "reader")
