"""StaticEngine: the same outputs as HFEngine where they must be equal, exact log-probs, a fair
sampler, seeds independent of batch and slot, live weights under a compiled step."""
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ragrl.engines.base import SamplingParams
from ragrl.engines.hf import HFEngine
from ragrl.engines.registry import make_engine, resolve_auto
from ragrl.engines.sampling import nucleus_mask, sample_tokens, uniform_noise
from ragrl.engines.static import StaticEngine, unsupported_reason
from ragrl.errors import ConfigError, RagrlError
from ragrl.models.lm_weights import load_policy

REPO = Path(__file__).resolve().parents[2]
QUESTIONS = ["Who wrote Hamlet?", "What is the capital of France and why is it famous?", "Name a colour."]


def chat(tok, text):
    ids = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "input_ids") else ids)


def rescore(model, prompt, generated) -> list[float]:
    with torch.inference_mode():
        logits = model(torch.tensor([prompt + generated])).logits[0].float()
    logprobs = torch.log_softmax(logits, -1)
    return [logprobs[len(prompt) - 1 + t, token].item() for t, token in enumerate(generated)]


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    model, tok = load_policy(str(tiny_model_dir))
    return model, tok


# -- the sampler: pure functions -------------------------------------------------------------

def test_gumbel_max_draws_follow_the_softmax_chi_square():
    """20,000 draws from one row's logits (each a different counter): chi-square against softmax."""
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0])
    n = 20_000
    tokens, _ = sample_tokens(logits.expand(n, -1).clone(), torch.ones(n), torch.ones(n),
                              torch.full((n,), 12345), torch.arange(n), use_top_p=False)
    observed = torch.bincount(tokens, minlength=6).double()
    expected = torch.softmax(logits.double(), -1) * n
    chi2 = float(((observed - expected) ** 2 / expected).sum())
    assert chi2 < 20.5, f"chi-square {chi2:.1f} with 5 degrees of freedom (p < 0.001 above 20.5)"


def test_temperature_and_seeds_change_the_draws_as_they_should():
    logits = torch.tensor([[1.0, 0.0, -1.0]]).expand(4000, -1).clone()
    ones, counters = torch.ones(4000), torch.arange(4000)
    hot, _ = sample_tokens(logits, ones * 4.0, ones, torch.full((4000,), 7), counters, use_top_p=False)
    cold, _ = sample_tokens(logits, ones * 0.25, ones, torch.full((4000,), 7), counters, use_top_p=False)
    # p(top) at T=4 is 0.42, at T=0.25 is 0.98
    assert 0.38 < (hot == 0).double().mean() < 0.46 and (cold == 0).double().mean() > 0.96
    u1 = uniform_noise(torch.tensor([1, 2]), torch.tensor([0, 0]), 50)
    u2 = uniform_noise(torch.tensor([1]), torch.tensor([0]), 50)
    assert torch.equal(u1[:1], u2) and not torch.equal(u1[0], u1[1])   # a row's noise is its own
    assert 0 < float(u1.min()) and float(u1.max()) < 1


def test_greedy_rows_take_the_argmax_and_logprobs_are_raw():
    """Hand-computed: logits [0, ln 3] → argmax 1, log p = ln(3/4); top-p 0.5 keeps only token 1."""
    logits = torch.tensor([[0.0, math.log(3.0)], [0.0, math.log(3.0)]])
    tokens, logprobs = sample_tokens(logits, torch.tensor([0.0, 1.0]), torch.tensor([1.0, 0.5]),
                                     torch.tensor([1, 2]), torch.tensor([0, 0]), use_top_p=True)
    assert tokens.tolist() == [1, 1]
    torch.testing.assert_close(logprobs, torch.full((2,), math.log(0.75)))
    mask = nucleus_mask(torch.tensor([[0.1, 0.6, 0.3], [0.5, 0.25, 0.25]]), torch.tensor([0.7, 1.0]))
    assert mask.tolist() == [[False, True, True], [True, True, True]]


# -- against HFEngine and a plain forward ----------------------------------------------------

def test_greedy_equals_hf_engine_on_smollm2_single_and_multi_turn(smollm2_policy):
    """The real SmolLM2 in float32: identical greedy tokens, turn 1 and (with KV reuse) turn 2."""
    model, tok = smollm2_policy
    prompts = [chat(tok, q) for q in QUESTIONS]
    params = SamplingParams(max_new_tokens=14, temperature=0, stop=[". "])
    observation = tok("\n<information>Doc 1: Paris is the capital of France. Shakespeare wrote Hamlet."
                      "</information>\n", add_special_tokens=False)["input_ids"]
    hf, static = HFEngine(model, tok), StaticEngine(model, tok, max_batch_size=2, check_every=5)
    outputs = []
    for engine in (hf, static):
        with engine.prefix_caching():
            first = engine.generate(prompts, params)
            second = engine.generate([p + g[0].token_ids + observation for p, g in zip(prompts, first)], params)
        outputs.append([(g[0].token_ids, g[0].stop_reason, g[0].text) for g in first + second])
    assert outputs[0] == outputs[1]
    assert {reason for _, reason, _ in outputs[1]} >= {"length"}
    assert static.prefill_tokens < sum(len(p) for p in prompts) * 2   # turn 2 reused turn 1's KV


def test_sampled_logprobs_equal_a_plain_forward(tiny):
    """Rows of different budgets, temperatures and top-p through 2 slots (rows wait, then refill)."""
    model, tok = tiny
    prompts = [chat(tok, q) for q in QUESTIONS]
    params = [SamplingParams(max_new_tokens=m, temperature=t, top_p=p, n=2, seed=3)
              for m, t, p in [(5, 1.0, 1.0), (16, 0.7, 0.9), (9, 1.3, 0.5)]]
    engine = StaticEngine(model, tok, max_batch_size=2, check_every=4)
    for prompt, sp, gens in zip(prompts, params, engine.generate(prompts, params)):
        assert len(gens) == 2
        for gen in gens:
            assert len(gen.token_ids) == sp.max_new_tokens or gen.stop_reason == "eos"
            torch.testing.assert_close(torch.tensor(gen.logprobs), torch.tensor(rescore(model, prompt, gen.token_ids)),
                                       atol=1e-4, rtol=0)


def test_a_rows_samples_do_not_depend_on_the_batch_or_its_slot(tiny):
    model, tok = tiny
    prompts = [chat(tok, q) for q in QUESTIONS]
    params = SamplingParams(max_new_tokens=12, temperature=1.0, n=3, seed=11)
    ids = lambda out: [[g.token_ids for g in gens] for gens in out]  # noqa: E731
    full = ids(StaticEngine(model, tok).generate(prompts, params))
    assert full == ids(StaticEngine(model, tok, max_batch_size=2, check_every=3).generate(prompts, params))
    assert full[:2] == ids(StaticEngine(model, tok).generate(prompts[:2], params))
    assert full != ids(StaticEngine(model, tok).generate(prompts, SamplingParams(max_new_tokens=12, n=3, seed=12)))
    assert all(len({tuple(t) for t in gens}) == 3 for gens in full)


def test_stops_eos_and_budgets_cut_at_the_token_that_ended_the_row(tiny):
    """A stop string completed mid-chunk: the row is cut there, not at the chunk's end."""
    model, tok = tiny
    prompt = chat(tok, QUESTIONS[0])
    sampled = SamplingParams(max_new_tokens=24, temperature=1.0, seed=4)
    (free,) = StaticEngine(model, tok).generate([prompt], sampled)[0]
    stop = next(s for j in range(9, 20) if (s := tok.decode(free.token_ids[j:j + 2]).strip()))
    ends = next(n for n in range(1, 25) if stop in tok.decode(free.token_ids[:n]))   # where HFEngine stops
    assert ends % 8 != 0                   # inside a chunk of 8, so the engine must cut back
    engine = StaticEngine(model, tok, check_every=8)
    (cut,) = engine.generate([prompt], SamplingParams(max_new_tokens=24, temperature=1.0, seed=4, stop=["@@", stop]))[0]
    assert cut.stop_reason == "stop" and cut.stop_string == stop and cut.token_ids == free.token_ids[:ends]
    eos = free.token_ids[5]
    (ended,) = StaticEngine(model, tok, eos_token_ids={eos}).generate([prompt], sampled)[0]
    first = free.token_ids.index(eos)
    assert ended.stop_reason == "eos" and ended.token_ids == free.token_ids[:first + 1]
    assert ended.text == tok.decode(free.token_ids[:first])


def test_compiled_step_follows_weights_changed_in_place(tiny):
    """torch.compile'd decode (inductor, on the CPU): same tokens as eager, and an in-place weight
    change (what an optimizer step does) moves the next call's logits."""
    model, tok = tiny
    prompts = [chat(tok, q) for q in QUESTIONS[:2]]
    greedy = SamplingParams(max_new_tokens=10, temperature=0)
    compiled = StaticEngine(model, tok, compile_mode="inductor", max_batch_size=2)
    before = compiled.generate(prompts, greedy)
    assert [g[0].token_ids for g in before] == [g[0].token_ids for g in StaticEngine(model, tok).generate(prompts, greedy)]
    weight = model.model.layers[-1].mlp.down_proj.weight
    saved = weight.detach().clone()
    try:
        with torch.no_grad():
            weight.mul_(3.0)
        after = compiled.generate(prompts, greedy)
        reference = HFEngine(model, tok).generate(prompts, greedy)
    finally:
        with torch.no_grad():
            weight.copy_(saved)
    assert max(abs(a - b) for g, h in zip(before, after) for a, b in zip(g[0].logprobs[1:], h[0].logprobs[1:])) > 1e-3
    assert [g[0].token_ids for g in after] == [g[0].token_ids for g in reference]


def test_constrained_requests_and_unsupported_models_are_routed_not_ignored(tiny):
    model, tok = tiny
    engine = StaticEngine(model, tok)
    allowed = SamplingParams(max_new_tokens=3, temperature=1.0, seed=0, allowed_tokens=lambda ids: [42, 43])
    (gen,) = engine.generate([chat(tok, "hi")], allowed)[0]
    assert set(gen.token_ids) <= {42, 43}
    assert resolve_auto(model) == "hf"      # on a CPU: as fast per step, and drops finished rows at once
    assert isinstance(make_engine("static", model, tok), StaticEngine)
    model.config.model_type = "gpt2"
    try:
        assert "gpt2" in unsupported_reason(model)
        with pytest.raises(ConfigError, match="model.engine=static: model type 'gpt2'"):
            make_engine("static", model, tok)
    finally:
        model.config.model_type = "llama"
    with pytest.raises(ConfigError, match="compile_mode"):
        StaticEngine(model, tok, compile_mode="fast")
    with pytest.raises(ConfigError, match="needs a CUDA device"):
        StaticEngine(model, tok, compile_mode="graphs")
    with pytest.raises(RagrlError, match="outside the vocabulary"):
        engine.generate([[1, 10**6]], allowed)


def test_gpu_script_dry_run_writes_every_section(tmp_path):
    """scripts/device/gpu_rollout.py --dry-run: the device script's paths on a CPU, tiny shapes (its
    compiled step is the test above's; here the static engine runs eager, as CUDA graphs need CUDA)."""
    out = tmp_path / "gpu_rollout.json"
    subprocess.run([sys.executable, str(REPO / "scripts/device/gpu_rollout.py"), "--dry-run", "--out", str(out),
                    "--only", "decode,episode,update_ab,grpo,compiled,generate_compiled"], check=True, cwd=tmp_path,
                   timeout=300, capture_output=True)
    import json

    result = json.loads(out.read_text())
    assert not result["errors"] and not result["skipped"]
    assert {r["system"] for r in result["decode"]} == {"static_graphs", "hf_engine", "generate_eager",
                                                      "generate_static_compiled"}
    episodes = {r["system"]: r for r in result["episode"]}
    assert list(episodes) == ["static", "static_loop", "hf"] and all(r["ratio_to_raw"] > 0 for r in episodes.values())
    assert episodes["static"]["gen_tokens"] == episodes["static_loop"]["gen_tokens"] > 0   # every turn to its budget
    assert episodes["static"]["obs_tokens_mean"] > 100                                      # real BM25 passages
    updates = result["update_ab"]["rows"]
    assert len(updates) == 7 and all(r["update_s"] > 0 for r in updates)
    assert [r["when"] for r in updates if "top_ops" in r] == ["profiled", "after an hf decode, profiled"]
    assert [(g["engine"], g["steps_timed"]) for g in result["grpo"]] == [("static", 1)]
    # a second call's decode rows merge into the first file; rows it already has are kept as they were
    extra = tmp_path / "second.json"
    extra.write_text(json.dumps({"device": "d2", "elapsed_s": 1.0, "decode": [
        {**result["decode"][0], "tokens_per_s": -1.0}, {"system": "generate_static_compiled", "shape": "qwen2.5-1.5b",
                                                        "batch": 256, "tokens_per_s": 9.0}]}))
    subprocess.run([sys.executable, str(REPO / "scripts/device/gpu_rollout.py"), "--merge", str(extra), "--out", str(out)],
                   check=True, cwd=tmp_path, timeout=120, capture_output=True)
    merged = json.loads(out.read_text())
    assert merged["decode"] == result["decode"] + [json.loads(extra.read_text())["decode"][1]]
    assert merged["episode"] == result["episode"] and merged["merged_calls"][0]["decode_rows"] == 1
