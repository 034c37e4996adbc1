"""No setting can be accepted and then ignored: every field of the training config is read somewhere.

A static check (cheap, no training): each dataclass field of TrainConfig, nested ones included,
must appear as an attribute access (`.name`) or a string key (`"name"`) in the package's code
outside the files that only declare or load the config. A new field that nothing reads fails here.
"""
import dataclasses
import re
from pathlib import Path

import pytest

from ragrl.train.config import TrainConfig

SRC = Path(__file__).resolve().parents[2] / "src" / "ragrl"
# Files that declare or (de)serialise the config: a field named there is not thereby honoured.
DECLARING = {SRC / "train" / "config.py", SRC / "yaml_config.py", SRC / "policy" / "model_config.py"}


def walk(cls, prefix=""):
    for f in dataclasses.fields(cls):
        yield prefix + f.name, f.name
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if dataclasses.is_dataclass(default):
            yield from walk(type(default), prefix + f.name + ".")


CODE = "\n".join(p.read_text() for p in SRC.rglob("*.py") if p not in DECLARING)
FIELDS = sorted(set(walk(TrainConfig)))


@pytest.mark.parametrize("path,name", FIELDS, ids=[p for p, _ in FIELDS])
def test_every_config_field_is_read_by_some_code_path(path, name):
    pattern = rf"\.{re.escape(name)}\b|[\"']{re.escape(name)}[\"']"
    assert re.search(pattern, CODE), f"config field {path} is declared but no code reads it"


def test_the_walk_covers_the_nested_sections():
    paths = {p for p, _ in FIELDS}
    assert {"model.engine", "algo.value_coef", "rollout.topk", "retriever.pool", "sft.max_len"} <= paths
    assert len(paths) > 80
