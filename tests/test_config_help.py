"""Each setting's help is written once, on its dataclass field (`setting(help=...)`): every setting
and section of the training config has one, the explain records say the right values, and the
settings tables of docs/recipes.md are exactly what scripts/settings_docs.py generates from them."""
from __future__ import annotations

import dataclasses
import difflib
import importlib.util
import re
from pathlib import Path
from typing import Literal

import pytest

from ragrl.algos.registry import ADVANTAGE_ESTIMATORS
from ragrl.config_help import (BEGIN, END, SectionHelp, SettingHelp, explain, format_explain, replace_between_markers,
                               settings_markdown, walk_settings)
from ragrl.errors import ConfigError
from ragrl.train.check import all_ranges
from ragrl.train.config import TrainConfig
from ragrl.train.recipe import load_train_config
from ragrl.yaml_config import setting

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "recipes.md"


def without_help(cls) -> list[str]:
    """Keys of the settings and sections of `cls` that carry no help."""
    return [r.key or cls.__name__ for r in walk_settings(cls) if not r.help.strip()]


def records(cfg=None, key=None) -> dict[str, SectionHelp | SettingHelp]:
    return {r.key: r for r in explain(TrainConfig, cfg, key, ranges=all_ranges())}


def leaf_keys(cls, prefix=""):
    """Every leaf field's dotted key, found by dataclasses alone (not by the code under test)."""
    for f in dataclasses.fields(cls):
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if dataclasses.is_dataclass(default):
            yield from leaf_keys(type(default), prefix + f.name + ".")
        else:
            yield prefix + f.name


# ---------------------------------------------------------------- every setting has its help

def test_every_setting_and_section_of_the_training_config_has_help():
    missing = without_help(TrainConfig)
    assert not missing, "settings or sections without help (declare them with setting(..., help=...)):\n" + \
        "\n".join(missing)


def test_the_walk_covers_every_leaf_once_and_the_sections():
    recs = list(walk_settings(TrainConfig))
    settings = [r.key for r in recs if isinstance(r, SettingHelp)]
    assert sorted(settings) == sorted(leaf_keys(TrainConfig)) and len(settings) == len(set(settings))
    sections = [r.key for r in recs if isinstance(r, SectionHelp)]
    assert sections == ["", "model", "data", "algo", "rollout", "sft", "guard", "retriever", "mmoa", "smartrag"]


@dataclasses.dataclass
class Inner:
    a: int = 1                                   # no help


@dataclasses.dataclass
class Outer:
    """A config."""

    b: int = setting(2, help="B.")
    inner: Inner = dataclasses.field(default_factory=Inner)   # a section with no help either


def test_the_help_check_sees_a_field_without_help():
    """The check above is worth something only if it fails on a plain field or a section with no help."""
    assert without_help(Outer) == ["inner", "inner.a"]


def test_setting_refuses_an_empty_help_and_keeps_defaults():
    with pytest.raises(ValueError, match="help"):
        setting(1, help="  ")
    f = setting(factory=lambda: [1], help="a\n   list")
    assert f.default_factory() == [1] and f.metadata["help"] == "a list"


# ---------------------------------------------------------------- the records

def test_choices_come_from_the_registries_when_asked():
    est = records()["algo.estimator"]
    assert est.choices == tuple(ADVANTAGE_ESTIMATORS) and "grpo" in est.choices and est.default == "grpo"
    ADVANTAGE_ESTIMATORS.register("my_estimator", ADVANTAGE_ESTIMATORS["grpo"])
    try:
        assert "my_estimator" in records()["algo.estimator"].choices   # read at call time, not at import
    finally:
        ADVANTAGE_ESTIMATORS.unregister("my_estimator")


def test_literals_bools_nulls_ranges_and_lists_are_described():
    r = records()
    assert r["model.dtype"].choices == ("float32", "bfloat16", "float16", "auto") and r["model.dtype"].type == "str"
    assert r["eval_start"].choices == ("true", "false") and not r["eval_start"].nullable
    assert r["shard_params"].allowed == "true, false, null" and r["shard_params"].default is None
    assert r["algo.dual_clip"].nullable and r["algo.dual_clip"].allowed == "> 1, or null"
    assert r["data.index"].allowed == "any str, or null"
    assert r["steps"].allowed == ">= 1" and r["ema_decay"].allowed == "in [0, 1)"
    assert r["report_to"].type == "list[str]" and r["report_to"].allowed == "items from tensorboard, wandb, mlflow"
    assert r["reward"].type == "mapping" and r["name"].allowed == ""
    assert "KL" in r["algo.kl_coef"].help and r["algo"].help   # a section carries its own one-line help


def test_values_are_the_recipes_and_defaults_the_root_class():
    cfg = load_train_config("search_r1_grpo", ["algo.kl_coef=0.05"], "tiny")
    r = records(cfg)
    assert r["rollout.n"].value == cfg.rollout.n == 8
    assert r["rollout.n"].default == 4   # TrainConfig's rollout default, not RolloutConfig's own (1)
    assert r["algo.kl_coef"].value == 0.05 and r["algo.kl_coef"].default == 0.0
    assert r["agent"].value == cfg.agent and r["model.dtype"].value == cfg.model.dtype
    assert all(rec.value == rec.default for rec in records().values() if isinstance(rec, SettingHelp))


def test_a_key_selects_one_setting_or_a_section_and_an_unknown_key_is_named():
    assert list(records(key="algo.estimator")) == ["algo.estimator"]
    algo = records(key="algo")
    assert list(algo)[0] == "algo" and all(k == "algo" or k.startswith("algo.") for k in algo) and len(algo) > 15
    assert len(records(key="all")) == len(records(key="")) == len(records())
    with pytest.raises(ConfigError, match=r"unknown setting 'algo\.estimatr'; did you mean 'algo\.estimator'"):
        records(key="algo.estimatr")
    with pytest.raises(ConfigError, match=r"unknown setting 'estimator'; did you mean 'algo\.estimator'"):
        records(key="estimator")
    with pytest.raises(ConfigError, match="unknown setting 'nothing_like_it'"):
        records(key="nothing_like_it")


def test_the_text_form_is_plain_and_complete():
    cfg = load_train_config("search_r1_grpo", [], "tiny")
    text = format_explain(explain(TrainConfig, cfg, ranges=all_ranges()))
    assert "\x1b[" not in text and "[/" not in text   # no terminal escapes, no rich markup
    assert "rollout.n = 8  (int; default 4)\n    allowed: >= 1\n    Samples per question" in text
    assert "[algo] The RL update" in text and text.count(" = ") >= len(list(leaf_keys(TrainConfig)))
    assert all(len(line) <= 100 for line in text.splitlines() if not re.match(r"\S+ = ", line))


# ---------------------------------------------------------------- the generated docs

def load_generator():
    spec = importlib.util.spec_from_file_location("settings_docs", REPO / "scripts" / "settings_docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_docs_settings_tables_match_the_fields_help():
    """docs/recipes.md holds exactly what the generator writes; edit a field's help, then regenerate."""
    text = DOC.read_text(encoding="utf-8")
    want = load_generator().render(text)
    if want != text:
        diff = "".join(list(difflib.unified_diff(text.splitlines(True), want.splitlines(True), "docs/recipes.md",
                                                 "generated", n=0))[:40])
        pytest.fail(f"docs/recipes.md's settings tables are out of date: run `python scripts/settings_docs.py`\n{diff}")


def test_the_docs_tables_cover_every_setting_with_five_cells_a_row():
    text = DOC.read_text(encoding="utf-8")
    block = text[text.index(BEGIN): text.index(END)]
    rows = [line for line in block.splitlines() if line.startswith("| `")]
    keys = [re.match(r"\| `([^`]+)`", row)[1] for row in rows]
    assert sorted(keys) == sorted(leaf_keys(TrainConfig))
    for row in rows:   # an unescaped | inside a cell would add a column
        assert len(re.split(r"(?<!\\)\|", row)) == 7, row
    for section in ("model", "data", "algo", "rollout", "sft", "retriever", "guard"):
        assert f"### `{section}`" in block


@dataclasses.dataclass
class Piped:
    """Config."""

    mode: Literal["a|b", "c"] = setting("c", help="Pick a|b or c; writes run_dir/best_<name>.")


def test_markdown_escapes_pipes_and_tags_and_markers_are_required():
    md = settings_markdown(Piped)
    row = next(line for line in md.splitlines() if line.startswith("| `mode`"))
    assert "a\\|b, c" in row and "best_&lt;name>" in row and len(re.split(r"(?<!\\)\|", row)) == 7
    assert replace_between_markers(f"x\n{BEGIN}\nold\n{END}\ny", "new") == f"x\n{BEGIN}\nnew\n{END}\ny"
    with pytest.raises(ConfigError, match="markers"):
        replace_between_markers("no markers here", "new")
