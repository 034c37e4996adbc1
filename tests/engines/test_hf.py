"""HFEngine: batching, log-prob exactness, stops, seeds, limits; tiny model mostly, SmolLM2 twice."""
import pytest
import torch

from ragrl.errors import ConfigError, RagrlError
from ragrl.models.lm_weights import load_policy
from ragrl.engines.base import SamplingParams
from ragrl.engines.registry import make_engine
from ragrl.engines.hf import HFEngine
from ragrl.engines.vllm import VLLMEngine

GREEDY = SamplingParams(max_new_tokens=24, temperature=0)
TEXTS = ["Hello world, how are you today my friend?", "Hi", "The capital of France is a city called"]


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    model, tok = load_policy(str(tiny_model_dir))
    return HFEngine(model, tok)


@pytest.fixture(scope="module")
def prompts(tiny):
    return [tiny.tokenizer(t)["input_ids"] for t in TEXTS]


def rescore(model, prompt, generated) -> list[float]:
    """Per-token log-probs of `generated` after `prompt` from one plain forward pass."""
    with torch.inference_mode():
        logits = model(torch.tensor([prompt + generated])).logits[0].float()
    logprobs = torch.log_softmax(logits, -1)
    return [logprobs[len(prompt) - 1 + t, token].item() for t, token in enumerate(generated)]


def test_batched_left_padded_greedy_equals_each_prompt_alone(tiny, prompts):
    assert len({len(p) for p in prompts}) == 3  # really different lengths, so padding matters
    batched = tiny.generate(prompts, GREEDY)
    for prompt, (gen,) in zip(prompts, batched):
        (alone,) = tiny.generate([prompt], GREEDY)[0]
        assert gen.token_ids == alone.token_ids
        assert len(gen.token_ids) == 24 and gen.stop_reason == "length"
        torch.testing.assert_close(torch.tensor(gen.logprobs), torch.tensor(alone.logprobs), atol=1e-4, rtol=0)


def test_sampled_logprobs_equal_a_plain_forward_rescoring(tiny, prompts):
    """Raw-logit log-probs, whatever the temperature/top-p: PPO ratios start at exactly 1."""
    # Different lengths, so rows leave the batch (and the KV cache) at different steps.
    params = [SamplingParams(max_new_tokens=m, temperature=t, top_p=p, n=2, seed=3)
              for m, t, p in [(5, 1.0, 1.0), (16, 0.7, 0.9), (9, 1.3, 0.5)]]
    for prompt, gens in zip(prompts, tiny.generate(prompts, params)):
        for gen in gens:
            assert len(gen.logprobs) == len(gen.token_ids) > 0
            torch.testing.assert_close(torch.tensor(gen.logprobs), torch.tensor(rescore(tiny.model, prompt, gen.token_ids)),
                                       atol=1e-4, rtol=0)


def test_each_prompt_stops_at_its_own_stop_string(tiny, prompts):
    free = [g[0] for g in tiny.generate(prompts[:2], GREEDY)]
    tok = tiny.tokenizer
    # Stop strings taken from the middle of each free-running output: where it must stop is known.
    stops = [tok.decode(free[0].token_ids[6:8]).strip(), tok.decode(free[1].token_ids[10:11]).strip()]
    assert all(stops) and stops[0] != stops[1]
    params = [SamplingParams(max_new_tokens=24, temperature=0, stop=["@@never@@", stops[0]]),
              SamplingParams(max_new_tokens=24, temperature=0, stop=[stops[1]]),
              SamplingParams(max_new_tokens=5, temperature=0, stop=["@@never@@"])]
    out = [g[0] for g in tiny.generate(prompts, params)]
    for gen, ref, stop in zip(out[:2], free, stops):
        n = len(gen.token_ids)
        assert gen.stop_reason == "stop" and gen.stop_string == stop
        assert gen.token_ids == ref.token_ids[:n]  # same path, cut at the right token:
        assert stop in tok.decode(gen.token_ids) and stop not in tok.decode(gen.token_ids[:-1])
        assert gen.text == tok.decode(gen.token_ids)
    assert (out[2].stop_reason, len(out[2].token_ids), out[2].stop_string) == ("length", 5, None)


def test_seeded_samples_are_reproducible_and_distinct(tiny, prompts):
    params = SamplingParams(max_new_tokens=12, temperature=1.0, n=4, seed=7)
    first = tiny.generate(prompts, params)
    again = tiny.generate(prompts, params)
    other = tiny.generate(prompts, SamplingParams(max_new_tokens=12, temperature=1.0, n=4, seed=8))
    ids = lambda out: [[g.token_ids for g in gens] for gens in out]  # noqa: E731
    assert ids(first) == ids(again)
    assert ids(first) != ids(other)
    assert all(len(gens) == 4 and len({tuple(g.token_ids) for g in gens}) == 4 for gens in first)
    # Per-row generators: a prompt's samples do not depend on the batch size it ran in.
    small_batches = HFEngine(tiny.model, tiny.tokenizer, max_batch_size=3).generate(prompts, params)
    assert ids(small_batches) == ids(first)


def test_tiny_top_p_keeps_only_the_top_token(tiny, prompts):
    nucleus = tiny.generate(prompts, SamplingParams(max_new_tokens=10, temperature=1.0, top_p=1e-6, seed=0))
    greedy = tiny.generate(prompts, SamplingParams(max_new_tokens=10, temperature=0))
    assert [g[0].token_ids for g in nucleus] == [g[0].token_ids for g in greedy]


def test_max_new_tokens_per_prompt(tiny, prompts):
    params = [SamplingParams(max_new_tokens=m, temperature=1.0, seed=1) for m in (1, 7, 3)]
    out = tiny.generate(prompts, params)
    assert [(len(g[0].token_ids), g[0].stop_reason) for g in out] == [(1, "length"), (7, "length"), (3, "length")]


def test_eos_ends_a_sequence_and_is_kept_in_ids_not_text(tiny, prompts):
    (free,) = tiny.generate(prompts[:1], GREEDY)[0]
    eos = free.token_ids[4]
    cut = free.token_ids.index(eos)  # its first occurrence is where generation must stop
    engine = HFEngine(tiny.model, tiny.tokenizer, eos_token_ids={eos})
    (gen,) = engine.generate(prompts[:1], GREEDY)[0]
    assert gen.stop_reason == "eos" and gen.token_ids == free.token_ids[:cut + 1]
    assert gen.text == tiny.tokenizer.decode(free.token_ids[:cut])
    assert {tiny.tokenizer.eos_token_id, tiny.tokenizer.convert_tokens_to_ids("<|im_end|>")} <= tiny.eos_token_ids


def test_peft_model_and_in_place_updates_need_no_sync(tiny_model_dir, prompts):
    from peft import LoraConfig, get_peft_model

    model, tok = load_policy(str(tiny_model_dir))
    peft_model = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], lora_dropout=0.1))
    peft_model.train()
    engine = HFEngine(peft_model, tok)
    params = SamplingParams(max_new_tokens=8, temperature=1.0, seed=0)
    before = engine.generate(prompts, params)
    assert peft_model.training  # generate() samples in eval mode but hands the module back as it was
    peft_model.eval()
    for prompt, (gen,) in zip(prompts, before):
        torch.testing.assert_close(torch.tensor(gen.logprobs), torch.tensor(rescore(peft_model, prompt, gen.token_ids)),
                                   atol=1e-4, rtol=0)
    with torch.no_grad():  # what an optimizer step does: change the very same parameters
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.add_(0.5)
    after = engine.generate(prompts, params)
    assert engine.model is peft_model
    assert [g[0].logprobs for g in after] != [g[0].logprobs for g in before]


def test_bad_inputs_raise_clear_errors(tiny, prompts):
    with pytest.raises(RagrlError, match="prompt 1 is empty"):
        tiny.generate([prompts[0], []], GREEDY)
    with pytest.raises(RagrlError, match="outside the vocabulary"):
        tiny.generate([[1, 49152]], GREEDY)
    with pytest.raises(ConfigError, match="2 SamplingParams for 3 prompts"):
        tiny.generate(prompts, [GREEDY, GREEDY])
    with pytest.raises(ConfigError, match="top_p"):
        tiny.generate(prompts, SamplingParams(top_p=0.0))
    with pytest.raises(ConfigError, match="max_new_tokens"):
        tiny.generate(prompts, SamplingParams(max_new_tokens=0))
    with pytest.raises(ConfigError, match="'tgi' is not one of auto, hf, static, vllm"):
        make_engine("tgi", tiny.model, tiny.tokenizer)


def test_engine_selection_without_vllm(tiny):
    engine = make_engine("hf", tiny.model, tiny.tokenizer, max_batch_size=3)
    assert isinstance(engine, HFEngine) and engine.model is tiny.model and engine.max_batch_size == 3
    with pytest.raises(ConfigError, match=r"model.engine=vllm: vllm is not installed \(pip install 'ragrl\[vllm\]'\)"):
        make_engine("vllm", tiny.model, tiny.tokenizer)
    with pytest.raises(RagrlError, match="CUDA"):
        VLLMEngine("smollm2-135m-instruct")


@pytest.fixture(scope="module")
def smollm2_engine(smollm2_path):
    return HFEngine.from_name(str(smollm2_path), max_batch_size=8)


def chat(tok, question):
    return tok.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True,
                                   return_dict=False)


def test_smollm2_answers_paris_and_stops_on_im_end(smollm2_engine):
    tok = smollm2_engine.tokenizer
    (gen,) = smollm2_engine.generate([chat(tok, "What is the capital of France?")],
                                     SamplingParams(max_new_tokens=40, temperature=0))[0]
    assert "Paris" in gen.text
    assert gen.stop_reason == "eos" and gen.token_ids[-1] == tok.convert_tokens_to_ids("<|im_end|>")
    assert "<|im_end|>" not in gen.text


def test_smollm2_batch_matches_single_and_rescoring(smollm2_engine):
    tok = smollm2_engine.tokenizer
    prompts = [chat(tok, q) for q in ("What is 2+2?", "Name a primary color. Answer in one word, please.")]
    greedy = SamplingParams(max_new_tokens=10, temperature=0)
    for prompt, (gen,) in zip(prompts, smollm2_engine.generate(prompts, greedy)):
        assert gen.token_ids == smollm2_engine.generate([prompt], greedy)[0][0].token_ids
    sampled = SamplingParams(max_new_tokens=10, temperature=0.8, top_p=0.95, n=2, seed=11, stop=["\n"])
    for prompt, gens in zip(prompts, smollm2_engine.generate(prompts, sampled)):
        for gen in gens:
            torch.testing.assert_close(torch.tensor(gen.logprobs),
                                       torch.tensor(rescore(smollm2_engine.model, prompt, gen.token_ids)),
                                       atol=1e-4, rtol=0)


def test_prefix_caching_continues_earlier_turns_exactly_and_prefills_less(tiny, prompts):
    """Turn 2 prompts extend turn 1's sequences (plus new 'observation' tokens, of different
    lengths per row): with the cache they prefill only the new tokens, and sample the same ids
    with the same log-probs (== a plain forward rescoring) as without it."""
    obs = [tiny.tokenizer(t)["input_ids"] for t in [" Observation: Paris.", " Nothing found here at all.", " 42"]]
    params = [SamplingParams(max_new_tokens=m, temperature=t, n=1, seed=5) for m, t in [(6, 0), (11, 1.0), (8, 0.8)]]

    def two_turns():
        first = tiny.generate(prompts, params)
        second_prompts = [p + g[0].token_ids + o for p, g, o in zip(prompts, first, obs)]
        before = tiny.prefill_tokens
        second = tiny.generate(second_prompts, params)
        return second_prompts, second, tiny.prefill_tokens - before

    plain_prompts, plain, plain_prefill = two_turns()
    with tiny.prefix_caching() as engine:
        cached_prompts, cached, cached_prefill = two_turns()
        assert engine._store.hits == len(prompts)
    assert tiny._store is None  # emptied and detached on exit
    assert cached_prompts == plain_prompts
    # only the last sampled token of turn 1 (never fed to the model) and the observation are new
    assert cached_prefill == sum(1 + len(o) for o in obs) < plain_prefill
    for prompt, (a,), (b,) in zip(plain_prompts, plain, cached):
        assert a.token_ids == b.token_ids
        torch.testing.assert_close(torch.tensor(b.logprobs), torch.tensor(a.logprobs), atol=1e-4, rtol=0)
        torch.testing.assert_close(torch.tensor(b.logprobs), torch.tensor(rescore(tiny.model, prompt, b.token_ids)),
                                   atol=1e-4, rtol=0)


def test_prefix_cache_is_not_used_for_unrelated_prompts(tiny, prompts):
    with tiny.prefix_caching() as engine:
        tiny.generate(prompts[:1], GREEDY)
        before = tiny.prefill_tokens
        (gen,), = tiny.generate(prompts[1:2], GREEDY)   # does not extend the stored sequence
        assert engine._store.hits == 0 and tiny.prefill_tokens - before == len(prompts[1])
    assert gen.token_ids == tiny.generate(prompts[1:2], GREEDY)[0][0].token_ids


def test_growing_cache_appends_in_place_and_matches_concatenation():
    from transformers import DynamicCache

    from ragrl.engines.kv_cache import new_cache

    g = torch.Generator().manual_seed(0)
    grow, ref = new_cache(), DynamicCache()
    chunks = [torch.randn(2, 3, t, 4, generator=g) for t in (5, 1, 1, 70, 1)]
    ptrs = []
    for i, c in enumerate(chunks):
        k, v = grow.update(c, -c, 0)
        rk, rv = ref.update(c, -c, 0)
        assert torch.equal(k, rk) and torch.equal(v, rv)
        ptrs.append(k.data_ptr())
        if i == 2:  # dropping a row replaces the tensors; the next append must still be right
            grow.batch_select_indices(torch.tensor([1, 0]))
            ref.batch_select_indices(torch.tensor([1, 0]))
    assert ptrs[1] == ptrs[0]          # the one-token append wrote into the same buffer
    assert grow.get_seq_length() == ref.get_seq_length() == 78
