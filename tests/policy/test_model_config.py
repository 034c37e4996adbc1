"""engine_for (policy/model_config.py): `auto` under a run that switches adapters (rollout.answer_by
other than policy) is hf."""
import pytest

from ragrl.engines import registry
from ragrl.engines.hf import HFEngine
from ragrl.engines.static import StaticEngine
from ragrl.models.lm_weights import load_policy
from ragrl.policy.model_config import ModelConfig, engine_for


@pytest.fixture
def gpu_auto(monkeypatch):
    """auto resolving as it does on a GPU (static), the one place the learn variants' switch was refused."""
    monkeypatch.setattr(registry, "resolve_auto", lambda model: "static")


def test_auto_switching_adapters_is_hf_where_auto_means_static(tiny_model_dir, gpu_auto):
    model, tok = load_policy(str(tiny_model_dir))
    mcfg = ModelConfig(engine="auto")
    assert isinstance(engine_for(mcfg, model, tok, max_batch_size=2), StaticEngine)
    assert isinstance(engine_for(mcfg, model, tok, max_batch_size=2, switches_adapters=True), HFEngine)


def test_an_engine_named_outright_is_kept(tiny_model_dir, gpu_auto):
    model, tok = load_policy(str(tiny_model_dir))
    engine = engine_for(ModelConfig(engine="static"), model, tok, max_batch_size=2, switches_adapters=True)
    assert isinstance(engine, StaticEngine)   # check_answer_by refuses this pair on load, with its reason
