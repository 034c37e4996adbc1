"""Policy resolution, the one-time SmolLM2 conversion (atomic, locked), and the tiny model."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ragrl.errors import ModelError
from ragrl.models import lm_weights as policy
from ragrl.models.lm_weights import COMPLETE, SMOLLM2, load_policy, load_tokenizer, resolve_policy
from ragrl.models.tiny import make_tiny_model


@pytest.fixture(scope="module")
def smollm2(smollm2_path):
    return load_policy(str(smollm2_path))


def test_aliases_resolve_to_the_converted_dir(smollm2_path):
    assert (smollm2_path / COMPLETE).is_file()
    assert (smollm2_path / "model.safetensors").is_file()
    for name in ("smollm2-135m-instruct", "SmolLM2-135M-Instruct", "HuggingFaceTB/SmolLM2-135M-Instruct"):
        assert resolve_policy(name) == smollm2_path


def test_existing_path_is_returned_as_is(tmp_path):
    assert resolve_policy(str(tmp_path)) == tmp_path


@pytest.mark.parametrize("name", ["no-such-org/no-such-model-xyz", "not a valid id!!"])
def test_unresolvable_name_raises_model_error(name):
    with pytest.raises(ModelError, match="no-such-model-xyz|not a valid id"):
        resolve_policy(name)
    with pytest.raises(ModelError):
        load_policy(name)


def test_path_without_a_model_raises_model_error(tmp_path):
    with pytest.raises(ModelError, match=re.escape(str(tmp_path))):
        load_policy(str(tmp_path))


def test_tokenizer_is_ready_for_batched_chat(smollm2_path):
    tok = load_tokenizer(SMOLLM2)
    assert tok.padding_side == "left"
    assert tok.pad_token == "<|endoftext|>" and tok.pad_token_id != tok.eos_token_id
    assert tok.eos_token == "<|im_end|>"
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert text.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")


def test_smollm2_knows_the_capital_of_france(smollm2):
    model, tok = smollm2
    ids = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                  add_generation_prompt=True, return_dict=False)
    with torch.inference_mode():
        out = model.generate(torch.tensor([ids]), max_new_tokens=20, do_sample=False)
    assert "Paris" in tok.decode(out[0, len(ids):])
    assert getattr(model.config, "quantization_config", None) is None
    assert not getattr(model, "is_quantized", False)  # a plain, trainable float32 model
    assert next(model.parameters()).dtype == torch.float32


def test_interrupted_conversion_is_never_complete_and_reconverts_once(tmp_path, monkeypatch, smollm2):
    """A failed conversion leaves nothing trusted; two processes racing afterwards convert once."""
    monkeypatch.setenv("RAGRL_HOME", str(tmp_path))
    target = tmp_path / "models" / SMOLLM2

    def crash_mid_write(gguf, out_dir):  # the injected fault: dies after writing part of the output
        (Path(out_dir) / "config.json").write_text("{")
        raise RuntimeError("disk full (injected)")

    monkeypatch.setattr(policy, "convert_gguf", crash_mid_write)
    with pytest.raises(RuntimeError, match="injected"):
        resolve_policy(SMOLLM2)
    assert not (target / COMPLETE).exists()
    assert not list(target.parent.glob(f".{SMOLLM2}.tmp-*"))  # the partial output was removed
    monkeypatch.undo()

    # Leftovers of an older crash: a target without COMPLETE and a dead process's temp dir.
    target.mkdir(parents=True)
    (target / "junk.bin").write_text("partial")
    (target.parent / f".{SMOLLM2}.tmp-dead").mkdir()
    code = "from ragrl.models.lm_weights import resolve_policy; print(resolve_policy('smollm2-135m-instruct'))"
    env = {**os.environ, "RAGRL_HOME": str(tmp_path)}
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [p.communicate(timeout=600) + (p.returncode,) for p in procs]
    assert [rc for _, _, rc in results] == [0, 0], results
    assert [out.strip() for out, _, _ in results] == [str(target)] * 2
    assert sum("ragrl: converting" in err for _, err, _ in results) == 1  # one converted, one waited
    assert (target / COMPLETE).is_file() and not (target / "junk.bin").exists()
    assert not list(target.parent.glob(f".{SMOLLM2}.tmp-*"))
    reconverted, _ = load_policy(str(target))
    reference, _ = smollm2
    for (name, a), (_, b) in zip(reconverted.state_dict().items(), reference.state_dict().items()):
        assert torch.equal(a, b), name


def test_tiny_model_is_deterministic_and_leaves_global_rng_alone(tiny_model_dir):
    state = torch.random.get_rng_state()
    a, tok = make_tiny_model(seed=0)
    b, _ = make_tiny_model(seed=0)
    c, _ = make_tiny_model(seed=1)
    assert torch.equal(torch.random.get_rng_state(), state)
    assert len(tok) == 49152 and a.config.vocab_size == 49152
    assert 2e6 < sum(p.numel() for p in a.parameters()) < 5e6
    for (name, pa), pb, pc in zip(a.state_dict().items(), b.state_dict().values(), c.state_dict().values()):
        assert torch.equal(pa, pb), name
    assert not torch.equal(a.model.embed_tokens.weight, c.model.embed_tokens.weight)
    # The saved copy (session fixture, seed 0) loads by path and computes the same logits.
    loaded, loaded_tok = load_policy(str(tiny_model_dir))
    ids = torch.tensor([tok("Hello there, tiny model")["input_ids"]])
    with torch.inference_mode():
        torch.testing.assert_close(loaded(ids).logits, a(ids).logits)
    assert loaded_tok.pad_token == "<|endoftext|>"
