"""What every setting of a config means, from the one place it is written: the `help` each dataclass
field carries (`setting(..., help=...)` in ragrl.yaml_config, as TRL's `field(metadata={"help": ...})`).

`walk_settings` walks a config dataclass tree: a SectionHelp for the root and each nested dataclass
field (a section, e.g. `algo`), a SettingHelp for every other field (a leaf: its dotted key, readable
type, value in a given config, default, allowed values and help). `ragrl train RECIPE --explain [KEY]`
prints them (`format_explain`); the settings tables of docs/recipes.md are `settings_markdown`'s,
written between the markers by `scripts/settings_docs.py` (a test fails when they drift).

This module knows no config class: callers pass theirs (it sits with yaml_config, below train/).

>>> from ragrl.yaml_config import setting
>>> @dataclasses.dataclass
... class Optim:
...     '''The optimizer.'''
...     lr: float = setting(1e-3, help="Learning rate.")
...     decay: Literal["none", "linear"] | None = setting("none", help="How the learning rate decays.")
>>> for r in walk_settings(Optim, Optim(lr=0.01), ranges={"lr": "(0, inf)"}):
...     print(r.help if isinstance(r, SectionHelp) else f"{r.line()}, allowed: {r.allowed}")
The optimizer.
lr = 0.01  (float; default 0.001), allowed: > 0
decay = none  (str; default none), allowed: none, linear, null
>>> explain(Optim, key="lr_")
Traceback (most recent call last):
...
ragrl.errors.ConfigError: unknown setting 'lr_'; did you mean 'lr'? (ragrl train RECIPE --explain lists every setting)
"""
from __future__ import annotations

import dataclasses
import difflib
import enum
import math
import textwrap
import types
import typing
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import yaml

from ragrl.errors import ConfigError
from ragrl.yaml_config import Choice, _plain, field_help

BEGIN, END = "<!-- settings:begin -->", "<!-- settings:end -->"
ALL = ("", "all")   # --explain keys that mean every setting


@dataclasses.dataclass(frozen=True)
class SectionHelp:
    """A nested config dataclass (`algo`), or the root ("")."""

    key: str
    help: str


@dataclasses.dataclass(frozen=True)
class SettingHelp:
    """One leaf setting of a config tree."""

    key: str                       # dotted: "algo.estimator"
    type: str                      # readable: "int", "str", "list[str]", "mapping"
    value: Any                     # in the config walked (the default when none was given)
    default: Any                   # what the config class gives when the recipe says nothing
    choices: tuple[str, ...]       # enumerated values (of each item, for a list); (): any of its type
    nullable: bool                 # null (None) is a valid value
    range: str                     # numeric bound from the caller's `ranges` (">= 1"), or ""
    help: str
    section: str                   # the key of its section ("" for the root's own settings)

    @property
    def allowed(self) -> str:
        """The values it takes, in words ("" when any value of its type goes)."""
        if self.choices:
            text = ", ".join(self.choices)
            text = f"items from {text}" if self.type.startswith("list") else text
            return f"{text}, null" if self.nullable else text
        if self.range:
            return f"{self.range}, or null" if self.nullable else self.range
        return f"any {self.type}, or null" if self.nullable else ""

    def line(self) -> str:
        """`key = value  (type; default D)`: the first line of its explanation."""
        return f"{self.key} = {value_text(self.value)}  ({self.type}; default {value_text(self.default)})"


Record = Union[SectionHelp, SettingHelp]


# ---------------------------------------------------------------- types in words

def _unwrap(tp: Any) -> tuple[Any, bool, list[Choice]]:
    """(the bare type, whether None is allowed, the Choice enumerations) of an annotation."""
    nullable, choices = False, []
    while True:
        origin = typing.get_origin(tp)
        if origin is Annotated:
            choices += [m for m in tp.__metadata__ if isinstance(m, Choice)]
            tp = typing.get_args(tp)[0]
        elif origin in (Union, types.UnionType) and type(None) in typing.get_args(tp):
            nullable = True
            rest = [a for a in typing.get_args(tp) if a is not type(None)]
            tp = rest[0] if len(rest) == 1 else Union[tuple(rest)]
        else:
            return tp, nullable, choices


def type_text(tp: Any) -> str:
    """An annotation in a recipe writer's words: str, int, float, bool, path, list[str], mapping, any."""
    tp, _, _ = _unwrap(tp)
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Literal:
        kinds = {type(a).__name__ for a in args}
        return kinds.pop() if len(kinds) == 1 else "literal"
    if origin in (Union, types.UnionType):
        return " | ".join(type_text(a) for a in args)
    if origin in (list, tuple, set, frozenset) or tp in (list, tuple, set, frozenset):
        return f"list[{type_text(args[0])}]" if args else "list"
    if origin is dict or tp is dict:
        return "mapping"
    if tp is Path:
        return "path"
    if tp is Any or tp is object:
        return "any"
    if isinstance(tp, type):
        return tp.__name__
    return str(tp).replace("typing.", "")


def choices_of(tp: Any) -> tuple[str, ...]:
    """The values an annotation enumerates (Literal members, Choice names read now, true/false,
    an Enum's values; a list's items'), or () when any value of its type goes."""
    tp, _, choices = _unwrap(tp)
    if choices:
        return tuple(str(n) for c in choices for n in c.names())
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Literal:
        return tuple(value_text(a) for a in args)
    if tp is bool:
        return ("true", "false")
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return tuple(value_text(m.value) for m in tp)
    if origin in (list, tuple, set, frozenset) and args:
        return choices_of(args[0])
    return ()


def value_text(value: Any) -> str:
    """A value as one would write it in a recipe or `--set`: null, true, 2e-05, [a, b], {f1: 1.0}."""
    value = _plain(value)
    if value is dataclasses.MISSING:
        return "(required)"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value if value.strip() == value and value else repr(value)
    if isinstance(value, (int, float)):
        return repr(value)
    return yaml.safe_dump(value, default_flow_style=True, width=math.inf, allow_unicode=True).strip()


def interval_text(interval: str) -> str:
    """A numeric interval as written in ragrl.train.check's RANGES, in words.

    >>> [interval_text(i) for i in ("[1, inf)", "(0, inf)", "[0, 1)", "(-inf, inf)")]
    ['>= 1', '> 0', 'in [0, 1)', 'any finite number']
    """
    lo, hi = (x.strip() for x in interval[1:-1].split(","))
    if lo == "-inf" and hi == "inf":
        return "any finite number"
    if hi == "inf":
        return (">= " if interval[0] == "[" else "> ") + lo
    return f"in {interval}"


# ---------------------------------------------------------------- the walk

def _class_help(cls: type) -> str:
    """The first paragraph of a class's own docstring ("" for a dataclass's generated one)."""
    doc = cls.__doc__ or ""
    if not doc.strip() or doc.startswith(f"{cls.__name__}("):
        return ""
    return " ".join(textwrap.dedent(doc).strip().split("\n\n")[0].split())


def _section_type(tp: Any) -> type | None:
    bare, _, _ = _unwrap(tp)
    return bare if isinstance(bare, type) and dataclasses.is_dataclass(bare) else None


def _field_default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def _default_instance(cls: type) -> Any:
    try:
        return cls()
    except TypeError:   # a required field: defaults are read field by field
        return None


def walk_settings(cls: type, cfg: Any = None, *, ranges: Mapping[str, str] | None = None) -> Iterator[Record]:
    """Depth first in field order: SectionHelp("", root help), then per field a SettingHelp, or for a
    nested dataclass its SectionHelp and its own fields. A setting's `default` is the root class's
    (TrainConfig's `rollout.n` is 4 although RolloutConfig's is 1); its `value` is `cfg`'s (an
    instance of `cls`), or the default. `ranges` maps dotted keys to intervals ("[1, inf)")."""
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
        raise ConfigError(f"{cls!r} is not a dataclass")
    yield SectionHelp("", _class_help(cls))
    default = _default_instance(cls)
    yield from _walk(cls, default if cfg is None else cfg, default, "", dict(ranges or {}))


def _walk(cls: type, obj: Any, default_obj: Any, prefix: str, ranges: dict) -> Iterator[Record]:
    hints = typing.get_type_hints(cls, include_extras=True)
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        key, tp = prefix + f.name, hints[f.name]
        default = getattr(default_obj, f.name) if default_obj is not None else _field_default(f)
        value = getattr(obj, f.name) if obj is not None else default
        section = _section_type(tp)
        if section is not None:
            yield SectionHelp(key, field_help(f) or _class_help(section))
            yield from _walk(section, value, default if default is not dataclasses.MISSING else None,
                             key + ".", ranges)
            continue
        yield SettingHelp(key=key, type=type_text(tp), value=value, default=default, choices=choices_of(tp),
                          nullable=_unwrap(tp)[1], range=interval_text(ranges[key]) if key in ranges else "",
                          help=field_help(f), section=prefix.rstrip("."))


def explain(cls: type, cfg: Any = None, key: str | None = None, *,
            ranges: Mapping[str, str] | None = None) -> list[Record]:
    """The records of every setting (key None, "" or "all"), of one setting, or of a section and
    everything under it. An unknown key is a ConfigError naming it and the closest keys."""
    records = list(walk_settings(cls, cfg, ranges=ranges))
    key = (key or "").strip().rstrip(".")
    if key in ALL:
        return records
    hits = [r for r in records if r.key == key or r.key.startswith(key + ".")]
    if hits:
        return hits
    keys = [r.key for r in records if r.key]
    leaf = key.rsplit(".", 1)[-1]
    near = [k for k in keys if k.rsplit(".", 1)[-1] == leaf]   # `estimator` or `data.estimator`: `algo.estimator`
    near += [k for k in keys if k.startswith(key) and k not in near]   # `algo.kl`: `algo.kl_coef`, ...
    near += [k for k in difflib.get_close_matches(key, keys, n=3, cutoff=0.75) if k not in near]
    near += [k for k in keys if k not in near   # a typo in the last part: `temprature`
             and difflib.SequenceMatcher(None, leaf, k.rsplit(".", 1)[-1]).ratio() >= 0.8]
    hint = f"; did you mean {' or '.join(repr(k) for k in near[:3])}?" if near else ""
    raise ConfigError(f"unknown setting {key!r}{hint} (ragrl train RECIPE --explain lists every setting)")


def grouped(records: list[Record]) -> list[tuple[SectionHelp | None, list[SettingHelp]]]:
    """The records by section in the order sections first appear, each section's own settings
    together (a nested section's after its parent's); the SectionHelp is None where `records`
    hold a section's settings but not the section itself (one key asked for)."""
    sections = {r.key: r for r in records if isinstance(r, SectionHelp)}
    groups: dict[str, list[SettingHelp]] = {k: [] for k in sections}
    for r in records:
        if isinstance(r, SettingHelp):
            groups.setdefault(r.section, []).append(r)
    return [(sections.get(k), settings) for k, settings in groups.items()]


# ---------------------------------------------------------------- text and Markdown

def format_explain(records: list[Record], *, width: int = 100) -> str:
    """Plain text (no markup, for a terminal or a pipe): a `[section] help` line per section, then
    per setting its `key = value  (type; default D)` line, its allowed values and its help, indented.

    >>> print(format_explain([SettingHelp("lr", "float", 0.01, 0.001, (), False, "> 0", "Learning rate.", "")]), end="")
    lr = 0.01  (float; default 0.001)
        allowed: > 0
        Learning rate.
    """
    out: list[str] = []
    for section, settings in grouped(records):
        if section is not None and (section.key or section.help):
            title = f"[{section.key or 'top level'}]" + (f" {section.help}" if section.help else "")
            out += textwrap.wrap(title, width, subsequent_indent="    ", break_on_hyphens=False)
        for s in settings:
            out.append(s.line())
            for text in ([f"allowed: {s.allowed}"] if s.allowed else []) + [s.help]:
                out += textwrap.wrap(text, width, initial_indent="    ", subsequent_indent="    ",
                                     break_on_hyphens=False)
        out.append("")
    return "\n".join(out).rstrip("\n") + "\n"


def _cell(text: str, code: bool = False) -> str:
    """A table cell: one line, `|` escaped (in code spans too, as GFM tables need), and outside
    code `<` as an entity, so that `<metric>` is shown rather than taken for an HTML tag.

    >>> print(_cell("best_<adapter|encoder>"), _cell("a|b", code=True))
    best_&lt;adapter\\|encoder> `a\\|b`
    """
    text = " ".join(str(text).split())
    if code:
        return f"`{text}`".replace("|", "\\|") if text else ""
    return text.replace("<", "&lt;").replace("|", "\\|")


def settings_markdown(cls: type, *, ranges: Mapping[str, str] | None = None, heading: str = "###",
                      names: Mapping[str, str] | None = None) -> str:
    """One Markdown table per section of `cls` (key | type | default | allowed | help) under a
    `heading` naming it (`names` maps a section key to its heading; the root's is "")."""
    parts = []
    for section, settings in grouped(list(walk_settings(cls, ranges=ranges))):
        if not settings or section is None:
            continue
        title = (names or {}).get(section.key) or (f"`{section.key}`" if section.key else "Top level")
        lines = [f"{heading} {title}", ""]
        if section.help:
            lines += [_cell(section.help), ""]
        lines += ["| key | type | default | allowed | help |", "|---|---|---|---|---|"]
        for s in settings:
            cells = [_cell(s.key, code=True), _cell(s.type), _cell(value_text(s.default), code=True),
                     _cell(s.allowed), _cell(s.help)]
            lines.append("| " + " | ".join(cells) + " |")
        parts.append("\n".join(lines))
    return "\n\n".join(parts) + "\n"


def replace_between_markers(text: str, block: str, *, where: str = "the document") -> str:
    """`text` with what lies between the BEGIN and END marker lines replaced by `block`."""
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise ConfigError(f"{where} has no {BEGIN} ... {END} markers")
    return text[: start + len(BEGIN)] + "\n" + block.strip("\n") + "\n" + text[end:]
