"""The static engine's slot state: the attention widths a decode step may use, and that attending
over the narrowest one changes nothing a row can see (real tiny model, float32)."""
import pytest

from ragrl.engines.base import SamplingParams
from ragrl.engines.slots import LENGTH_STEP, Row, SlotState, attention_widths
from ragrl.engines.static import StaticEngine
from ragrl.models.lm_weights import load_policy


def test_widths_are_a_power_of_two_ladder_up_to_the_reserved_length():
    assert LENGTH_STEP == 256
    assert attention_widths(256) == [256]
    assert attention_widths(768) == [256, 512, 768]
    assert attention_widths(1280) == [256, 512, 1024, 1280]
    assert attention_widths(2048) == [256, 512, 1024, 2048]


def test_a_chunk_attends_over_the_narrowest_width_that_holds_its_rows():
    rows = [Row(0, [1] * 250, SamplingParams(), 0), Row(1, [1] * 100, SamplingParams(), 0)]
    rows[0].token_ids = [2, 3]          # position 251: the chunk's 4 steps reach column 254
    state = SlotState.__new__(SlotState)
    state.widths = attention_widths(1280)
    assert state.width_for(rows, 4) == 256
    assert state.width_for(rows, 8) == 512      # column 258
    rows[1].token_ids = [5] * 800
    assert state.width_for(rows, 8) == 1024


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return load_policy(str(tiny_model_dir))


def test_narrow_widths_give_the_tokens_and_logprobs_of_the_full_length(tiny, monkeypatch):
    """Rows that grow from column ~10 to ~600 (widths 256, 512, then 768 of L = 768), sampled: the
    same tokens and log-probs as an engine attending over all 768 columns every step."""
    model, tok = tiny
    prompts = [tok(t)["input_ids"] for t in ("A short one.", "Another prompt, a little longer than the first.")]
    params = SamplingParams(max_new_tokens=590, temperature=1.0, seed=2)
    seen = []
    original = SlotState.width_for
    monkeypatch.setattr(SlotState, "width_for", lambda self, rows, steps: seen.append(original(self, rows, steps)) or seen[-1])
    narrow = StaticEngine(model, tok, eos_token_ids={-1}).generate(prompts, params)
    assert set(seen) == {256, 512, 768}
    asked = len(seen)
    full = StaticEngine(model, tok, eos_token_ids={-1}, width_buckets=False).generate(prompts, params)
    assert len(seen) == asked               # the full-width engine attends over all 768 columns, never narrower
    assert len(full[0][0].token_ids) == 590
    for a, b in zip(narrow, full):
        assert a[0].token_ids == b[0].token_ids
        assert max(abs(x - y) for x, y in zip(a[0].logprobs, b[0].logprobs)) < 1e-4
