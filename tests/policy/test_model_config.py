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


def test_a_kind_given_by_the_caller_overrides_the_section_and_keeps_its_compile_and_batch(tiny_model_dir, gpu_auto):
    """`ragrl eval --engine hf` over a run whose section says static: the flag's kind, the section's rest."""
    model, tok = load_policy(str(tiny_model_dir))
    mcfg = ModelConfig(engine="static", compile="off", max_batch_size=3)
    assert isinstance(engine_for(mcfg, model, tok, kind="hf"), HFEngine)
    engine = engine_for(mcfg, model, tok)
    assert isinstance(engine, StaticEngine) and engine.max_batch_size == 3


def test_engines_are_built_from_a_model_section_in_one_place():
    """Issue #55: one way to build an engine. Outside the engines package only `engine_for` calls
    `make_engine`, so training, `ragrl eval`, compare and the quickstart cannot pick kinds differently."""
    from pathlib import Path

    src = Path(__file__).resolve().parents[2] / "src" / "ragrl"
    callers = sorted(str(p.relative_to(src)) for p in src.rglob("*.py")
                     if "make_engine(" in p.read_text() and p.parent.name != "engines")
    assert callers == ["policy/model_config.py"], callers
