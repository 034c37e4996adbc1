"""Wall-time bounds (rollout.max_episode_s / max_rollout_s, SamplingParams.deadline): the engines cut
a row at its deadline and let the others decode on; the runners end an episode past its bound as
"timeout" (truncated, no answer) and every other episode as it would have ended.

Real tiny model (HFEngine, and StaticEngine in eager mode on the CPU), a real BM25 index. Slowness is
injected, never faked: a forward hook that sleeps in every model step, or `StallingEngine`, which
wraps the real engine and makes one row hang until its deadline (the fault a stuck episode is).
"""
import contextlib
import time
from dataclasses import replace

import pytest

from ragrl.datasets import load_questions
from ragrl.engines.base import Generation, SamplingParams
from ragrl.engines.hf import HFEngine
from ragrl.engines.static import StaticEngine
from ragrl.engines.vllm import VLLMEngine
from ragrl.errors import ConfigError
from ragrl.methods.mmoa.pipeline import MMOABudgets, run_mmoa_episodes
from ragrl.methods.mmoa.protocol import MMOAProtocol
from ragrl.models.lm_weights import load_policy
from ragrl.rollout.config import RolloutConfig
from ragrl.rollout.multi_turn import episode_deadline, run_episodes
from ragrl.rollout.protocol import get_protocol
from tests.rollout.scripted import CountingRetriever, check_token_invariants

TEXTS = ["Hello world, how are you today my friend?", "The capital of France is a city called"]
GREEDY = SamplingParams(max_new_tokens=16, temperature=0)
STEP_S = 0.05     # the injected cost of one model step


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return load_policy(str(tiny_model_dir))


@pytest.fixture(scope="module")
def hf(tiny):
    return HFEngine(*tiny)


@pytest.fixture(scope="module")
def static(tiny):
    return StaticEngine(*tiny, max_batch_size=2, check_every=4)


@pytest.fixture(scope="module")
def prompts(tiny):
    return [tiny[1](t)["input_ids"] for t in TEXTS]


@pytest.fixture(scope="module")
def samples():
    return load_questions("demo-eval", limit=3)


@contextlib.contextmanager
def slow_steps(model, seconds: float):
    """Every forward pass (prefill or decode step, either engine) takes `seconds` longer: the embedding
    runs once per step in both engines."""
    handle = model.get_input_embeddings().register_forward_hook(lambda *_: time.sleep(seconds))
    try:
        yield
    finally:
        handle.remove()


class StallingEngine:
    """The fault: the real engine generates every row, then from call `at_call` on, the row whose
    prompt shows `question` hangs until its deadline (or `stall_s` with none: the stuck episode
    this guards against) and comes back cut after `keep` of its tokens, as an engine cuts a row at
    its deadline. Every other row gets the real engine's generation."""

    def __init__(self, inner, question: str, at_call: int, stall_s: float, keep: int = 2):
        self.inner, self.tokenizer, self.question = inner, inner.tokenizer, question
        self.at_call, self.stall_s, self.keep = at_call, stall_s, keep
        self.calls: list[list[SamplingParams]] = []
        self.cut: Generation | None = None

    def generate(self, prompts, params):
        self.calls.append(list(params))
        out = self.inner.generate(prompts, params)
        if len(self.calls) < self.at_call:
            return out
        for k, (prompt, sp) in enumerate(zip(prompts, params)):
            if self.question in self.tokenizer.decode(prompt):
                until = sp.deadline if sp.deadline is not None else time.monotonic() + self.stall_s
                time.sleep(max(0.0, until - time.monotonic()))
                g = out[k][0]
                ids = g.token_ids[:self.keep]
                self.cut = Generation(ids, g.logprobs[:self.keep], "timeout", text=self.tokenizer.decode(ids))
                out[k] = [self.cut]
        return out


class SlowTurnEngine:
    """The real engine, then a wait of `after_s` (a slow retrieval, a busy machine: the turn itself
    came back whole)."""

    def __init__(self, inner, after_s: float):
        self.inner, self.tokenizer, self.after_s = inner, inner.tokenizer, after_s
        self.calls: list[tuple[float, list[SamplingParams]]] = []

    def generate(self, prompts, params):
        self.calls.append((time.monotonic(), list(params)))
        out = self.inner.generate(prompts, params)
        time.sleep(self.after_s)
        return out


# -- engines ------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["hf", "static"])
def test_a_row_past_its_deadline_returns_at_once_while_its_batch_mate_decodes_to_its_own_stop(kind, hf, static,
                                                                                             prompts):
    engine = hf if kind == "hf" else static
    (alone,) = engine.generate([prompts[1]], GREEDY)[0]
    late = replace(GREEDY, deadline=time.monotonic() - 1.0)
    cut, normal = (g[0] for g in engine.generate(prompts, [late, GREEDY]))
    assert cut.stop_reason == "timeout" and len(cut.token_ids) <= 1 and len(cut.logprobs) == len(cut.token_ids)
    assert normal.stop_reason == alone.stop_reason != "timeout"
    assert normal.token_ids == alone.token_ids and normal.text == alone.text


@pytest.mark.parametrize("kind", ["hf", "static"])
def test_a_row_reaching_its_deadline_mid_decode_keeps_the_tokens_and_logprobs_it_has(kind, hf, static, prompts):
    engine = hf if kind == "hf" else static
    full = [g[0] for g in engine.generate(prompts, GREEDY)]
    assert all(len(g.token_ids) == GREEDY.max_new_tokens for g in full)   # no early eos: the cut is the bound's
    with slow_steps(engine.model, STEP_S):
        start = time.monotonic()
        cut, normal = (g[0] for g in engine.generate(prompts, [replace(GREEDY, deadline=start + 6 * STEP_S), GREEDY]))
        took = time.monotonic() - start
    n = len(cut.token_ids)
    assert cut.stop_reason == "timeout" and 1 <= n < GREEDY.max_new_tokens
    assert cut.token_ids == full[0].token_ids[:n] and cut.logprobs == pytest.approx(full[0].logprobs[:n], abs=1e-4)
    assert normal.token_ids == full[1].token_ids and normal.stop_reason == "length"
    assert took >= GREEDY.max_new_tokens * STEP_S    # the other row was not cut with it


def test_static_row_whose_deadline_passes_while_it_waits_for_a_slot_gets_no_tokens(tiny, prompts):
    """One slot: the shorter prompt decodes first (16 slow steps); the other row's deadline passes
    while it waits, so it is never prefilled."""
    engine = StaticEngine(*tiny, max_batch_size=1, check_every=4)
    (alone,) = engine.generate([prompts[1]], GREEDY)[0]
    with slow_steps(engine.model, STEP_S):
        waited, first = (g[0] for g in engine.generate(
            prompts, [replace(GREEDY, deadline=time.monotonic() + 4 * STEP_S), GREEDY]))
    assert len(prompts[1]) < len(prompts[0])
    assert waited.stop_reason == "timeout" and waited.token_ids == [] and waited.logprobs == []
    assert first.token_ids == alone.token_ids and first.stop_reason == alone.stop_reason


def test_vllm_refuses_a_deadline_rather_than_ignoring_it():
    engine = object.__new__(VLLMEngine)   # no GPU here: generate refuses before vLLM is touched
    with pytest.raises(ConfigError, match="does not support wall-time bounds.*engine=hf or static"):
        engine.generate([[1, 2]], SamplingParams(deadline=time.monotonic() + 60))


# -- the multi-turn runner ---------------------------------------------------------------------

def test_episode_deadline_is_the_earlier_bound_and_bounds_are_checked():
    assert episode_deadline(RolloutConfig(), 100.0, 105.0) is None
    assert episode_deadline(RolloutConfig(max_episode_s=10), 100.0, 105.0) == 115.0     # from the episode's start
    assert episode_deadline(RolloutConfig(max_rollout_s=12), 100.0, 105.0) == 112.0     # from the rollout's
    assert episode_deadline(RolloutConfig(max_episode_s=10, max_rollout_s=12), 100.0, 105.0) == 112.0
    for bad in (0, -1.0, "5", True):
        with pytest.raises(ConfigError, match="rollout.max_episode_s must be a number of seconds > 0"):
            episode_deadline(RolloutConfig(max_episode_s=bad), 0.0, 0.0)


def bound_and_stall(run) -> tuple[float, float]:
    """A bound the unstalled rollout `run` keeps well within (here), and a stall well beyond it."""
    start = time.monotonic()
    run()
    bound = max(1.0, 4 * (time.monotonic() - start))
    return bound, bound + 3.0


@pytest.mark.parametrize("keep", [2, 0])
def test_a_stalled_episode_times_out_and_the_others_finish_as_without_the_stall(keep, hf, index, samples):
    """Three greedy episodes of two turns; in the second turn one row hangs. With max_episode_s
    set it is cut at its deadline: kept as the tokens it had (`keep`: a cut with none adds no
    turn), no answer, no retrieval, stop "timeout"; the other two end exactly as in a run without
    the stall, and the rollout takes about max_episode_s, not the stall."""
    protocol = get_protocol("search_r1")
    base = RolloutConfig(max_turns=2, max_turn_tokens=8, max_response_tokens=64, max_obs_tokens=48, topk=2,
                         temperature=0.0, n=1, seed=3)
    reference, ref_stats = run_episodes(hf, protocol, index, samples, base)
    assert ref_stats["timeouts"] == 0 and all(t.stop_reason != "timeout" for t in reference)
    bound, stall_s = bound_and_stall(lambda: run_episodes(hf, protocol, index, samples, base))
    stalled_q = samples[1]["question"]
    engine = StallingEngine(hf, stalled_q, at_call=2, stall_s=stall_s, keep=keep)
    start = time.monotonic()
    trajs, stats = run_episodes(engine, protocol, index, samples, replace(base, max_episode_s=bound))
    took = time.monotonic() - start
    assert engine.cut is not None and len(engine.calls) == 2         # the stall happened, in turn 2
    assert bound <= took < min(stall_s, bound + 1.0)
    deadlines = {sp.deadline for call in engine.calls for sp in call}
    assert len(deadlines) == 1 and start + bound <= deadlines.pop() <= start + bound + 0.5
    stuck, ref = trajs[1], reference[1]
    assert stuck.stop_reason == "timeout" and stuck.answer is None and stats["timeouts"] == 1
    cut = engine.cut.token_ids
    assert len(cut) == keep
    if keep:
        assert stuck.turns[-1].kind == "truncated" and stuck.turns[-1].observation == ""
        assert stuck.turns[-1].queries == [] and stuck.num_turns == 2
        assert stuck.token_ids[-keep:] == cut and stuck.action_mask[-keep:] == [1] * keep
        assert stuck.logprobs[-keep:] == engine.cut.logprobs
    else:
        assert stuck.num_turns == len(stuck.turns) == 1 and stuck.turns[0].kind != "truncated"
    # turn 1 as without the stall, and the cut turn the start of the uncut one
    assert stuck.token_ids == ref.token_ids[:len(stuck.token_ids)] and len(ref.token_ids) > len(stuck.token_ids)
    check_token_invariants(stuck, hf.tokenizer, hf.eos_token_ids)
    for t, r in zip([trajs[0], trajs[2]], [reference[0], reference[2]]):
        assert (t.token_ids, t.stop_reason, t.answer, t.num_turns) == (r.token_ids, r.stop_reason, r.answer,
                                                                       r.num_turns)
        assert t.stop_reason != "timeout"


def test_an_episode_past_the_rollout_bound_before_a_turn_ends_without_generating(hf, index, samples):
    """max_rollout_s = 0.5 (and a lax max_episode_s): turn 1 comes back whole but late, so every
    episode still running ends before turn 2 without another generate call."""
    engine = SlowTurnEngine(hf, after_s=0.6)
    cfg = RolloutConfig(max_turns=3, max_turn_tokens=8, max_response_tokens=64, temperature=0.0, seed=3,
                        max_episode_s=60.0, max_rollout_s=0.5)
    start = time.monotonic()
    trajs, stats = run_episodes(engine, get_protocol("search_r1"), index, samples, cfg)
    assert len(engine.calls) == 1
    called, params = engine.calls[0]
    assert all(start + 0.5 <= sp.deadline <= called + 0.5 for sp in params)      # the rollout's bound, the earlier
    running = [t for t in trajs if t.stop_reason not in ("answer", "no_answer", "format_error")]
    assert running and all(t.stop_reason == "timeout" and t.answer is None and t.num_turns == 1 for t in running)
    assert all(t.turns[0].kind != "truncated" for t in running)                  # turn 1 was whole
    assert stats["timeouts"] == len(running)
    # Past the bound before the first turn: nothing is generated at all.
    never = SlowTurnEngine(hf, after_s=0.0)
    trajs, stats = run_episodes(never, get_protocol("search_r1"), index, samples, replace(cfg, max_rollout_s=1e-9))
    assert never.calls == [] and stats["timeouts"] == len(trajs) == 3
    assert all(t.num_turns == 0 and t.turns == [] and sum(t.action_mask) == 0 for t in trajs)


# -- the MMOA pipeline runner ------------------------------------------------------------------

def test_mmoa_pipeline_cut_at_its_generator_times_out_and_the_others_are_untouched(hf, index, samples):
    """The last agent of one pipeline hangs: that pipeline's three trajectories end "timeout" with no
    answer, the generator's holding the tokens it had; the other pipelines end as without the stall."""
    base, budgets = RolloutConfig(n=1, temperature=0.0, seed=0), MMOABudgets(16, 8, 12)
    reference, _ = run_mmoa_episodes(hf, MMOAProtocol(), index, samples, base, budgets=budgets)
    bound, stall_s = bound_and_stall(lambda: run_mmoa_episodes(hf, MMOAProtocol(), index, samples, base,
                                                               budgets=budgets))
    engine = StallingEngine(hf, samples[0]["question"], at_call=3, stall_s=stall_s)   # rewriter, selector, generator
    start = time.monotonic()
    trajs, stats = run_mmoa_episodes(engine, MMOAProtocol(), index, samples, replace(base, max_episode_s=bound),
                                     budgets=budgets)
    assert engine.cut is not None and time.monotonic() - start < min(stall_s, bound + 1.0)
    assert [t.agent for t in trajs] == [t.agent for t in reference]
    assert stats["timeouts"] == 3
    stuck = trajs[:3]
    assert all(t.stop_reason == "timeout" and t.answer is None for t in stuck)
    assert stuck[2].token_ids[stuck[2].prompt_len:] == engine.cut.token_ids
    for t, r in zip(trajs[3:], reference[3:]):
        assert (t.token_ids, t.stop_reason, t.answer) == (r.token_ids, r.stop_reason, r.answer)


def test_mmoa_pipeline_past_its_bound_runs_no_agent_and_no_retrieval(hf, index, samples):
    engine, retriever = SlowTurnEngine(hf, 0.0), CountingRetriever(index)
    trajs, stats = run_mmoa_episodes(engine, MMOAProtocol(), retriever, samples[:2],
                                     RolloutConfig(n=2, temperature=0.0, max_rollout_s=1e-9))
    assert engine.calls == [] and retriever.calls == []
    assert [t.agent for t in trajs] == ["rewriter", "selector", "generator"] * 4 and stats["timeouts"] == 12
    assert all(t.stop_reason == "timeout" and t.answer is None and sum(t.action_mask) == 0 for t in trajs)
    assert all(t.metrics["penalized"] is False for t in trajs)


# -- the retrieval-only runner (HARR without a generator) --------------------------------------

class SlowSampler:
    """A real stochastic retriever whose draws take `delay_s` longer (a loaded encoder server)."""

    def __init__(self, inner, delay_s: float):
        self.inner, self.delay_s, self.draws = inner, delay_s, 0
        self.index, self.history_words = inner.index, inner.history_words

    def sample(self, requests, k, generator=None):
        self.draws += 1
        out = self.inner.sample(requests, k, generator=generator)
        time.sleep(self.delay_s)
        return out


def test_retrieval_only_episodes_stop_drawing_past_their_bound(tmp_path, samples):
    """Three hops a question, each draw 0.4 s, max_rollout_s 0.3: hop 1 is never interrupted, but no
    later hop is drawn and every episode ends "timeout" with the hop it has."""
    import json

    from ragrl.models.query_encoder import QueryEncoder
    from ragrl.paths import DEMO_CORPUS
    from ragrl.retrieval.corpus import load_corpus
    from ragrl.retrieval.index import build_index, load_index
    from ragrl.retrieval.stochastic import StochasticRetriever
    from ragrl.rollout.retrieval_only import run_retrieval_episodes

    corpus = load_corpus(DEMO_CORPUS)
    # 20 short passages: a real dense index, encoded in a moment
    rows = [{"id": corpus.ids[i], "title": corpus.titles[i], "text": " ".join(corpus.texts[i].split()[:15])}
            for i in range(20)]
    (tmp_path / "corpus.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    dense = load_index(build_index(tmp_path / "corpus.jsonl", tmp_path / "dense", kind="dense",
                                   progress=False)).backend
    sampler = SlowSampler(StochasticRetriever(dense, QueryEncoder("all-minilm-l6-v2"), pool=10), delay_s=0.4)
    trajs, stats = run_retrieval_episodes(sampler, samples, RolloutConfig(n=2, topk=3, seed=0, max_rollout_s=0.3),
                                          hops=3)
    assert sampler.draws == 1 and stats["timeouts"] == len(trajs) == 6
    assert all(t.stop_reason == "timeout" and t.num_turns == len(t.turns) == 1 for t in trajs)
    unbounded, stats = run_retrieval_episodes(sampler.inner, samples, RolloutConfig(n=2, topk=3, seed=0), hops=3)
    assert stats["timeouts"] == 0 and all(t.stop_reason == "retrieved" and t.num_turns == 3 for t in unbounded)
