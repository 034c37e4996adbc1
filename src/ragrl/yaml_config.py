"""Typed configs: dataclasses filled from YAML recipes and `--set key.sub=value` overrides.

Resolution order (later wins): the `base:` recipe chain, the recipe itself, the chosen
entry of its `variants:` mapping, then the command-line overrides. Everything is merged
as plain dicts first and only then checked against the dataclass fields, so every
mistake (unknown key, wrong type) is reported with its full dotted key. A field declared
`setting(..., whole=True)` (a reward spec) that a child recipe sets replaces its base's whole,
in the base recipe and in every variant the child inherits: a method's own reward never
gains its base method's terms. Within one file a variant still merges into its recipe. An
override of the whole field (`reward={em: 1.0}`) replaces it; one of a key inside it merges. Each field carries
its help with `setting(...)` (read by ragrl.config_help: `--explain` and the docs' tables).

    @dataclass
    class Optim:
        lr: float = setting(1e-6, help="AdamW's learning rate.")
    @dataclass
    class Recipe:
        model: str = setting("smollm2-135m", help="The LM: a registry name, HF id or local path.")
        optim: Optim = setting(factory=Optim, help="The optimizer.")

    cfg = load_config(Recipe, "recipes/search_r1.yaml", ["optim.lr=3e-6"], variant="tiny")
"""
from __future__ import annotations

import dataclasses
import difflib
import enum
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Callable, Literal, TypeVar, Union

import yaml

from ragrl.errors import ConfigError

T = TypeVar("T")


# ---------------------------------------------------------------- enumerations from registries

@dataclasses.dataclass(frozen=True)
class Choice:
    """Annotated[str, Choice(names)]: a string that must be one of `names()`, read when a config is
    loaded. The names come from a registry, so an enumeration is written once (where its entries
    are registered) and a method registered later is a valid value at once.

    >>> @dataclasses.dataclass
    ... class C:
    ...     colour: Annotated[str, Choice(lambda: ["blue", "red"])] = "red"
    >>> config_from_dict(C, {"colour": "blue"}).colour
    'blue'
    >>> config_from_dict(C, {"colour": "bleu"})
    Traceback (most recent call last):
    ...
    ragrl.errors.ConfigError: colour: 'bleu' is not one of blue, red; did you mean 'blue'?
    """

    names: Callable[[], list[str]]


# ---------------------------------------------------------------- settings with their help

HELP = "help"   # the metadata key of a field's help text (as in TRL's `field(metadata={"help": ...})`)
WHOLE = "whole"  # the metadata key of setting(..., whole=True): a child recipe replaces the value whole


def setting(default: Any = dataclasses.MISSING, *, factory: Any = dataclasses.MISSING,
            help: str, whole: bool = False) -> Any:  # noqa: A002 (`help`, as TRL's metadata names it)
    """A dataclass field that carries its user-facing help: the one source of what a setting means,
    read by `ragrl train RECIPE --explain` and the settings tables of docs/recipes.md
    (ragrl.config_help). `default` is a plain default, `factory` a default_factory (one of them, or
    neither for a required field); the help's runs of whitespace become single spaces. `whole`: a
    child recipe that sets this field replaces its base's value instead of merging into it.

    >>> @dataclasses.dataclass
    ... class Optim:
    ...     lr: float = setting(1e-6, help="Learning rate of the   optimizer.")
    ...     betas: list = setting(factory=lambda: [0.9, 0.99], help="Adam's betas.")
    >>> Optim().betas, field_help(dataclasses.fields(Optim)[0])
    ([0.9, 0.99], 'Learning rate of the optimizer.')
    """
    if not isinstance(help, str) or not help.strip():
        raise ValueError("setting(): help must be a non-empty text")
    meta = {HELP: " ".join(help.split()), **({WHOLE: True} if whole else {})}
    return dataclasses.field(default=default, default_factory=factory, metadata=meta)


def whole_fields(cls: type) -> tuple[str, ...]:
    """The top-level fields of `cls` declared setting(..., whole=True)."""
    return tuple(f.name for f in dataclasses.fields(cls) if f.metadata and f.metadata.get(WHOLE))


def field_help(f: dataclasses.Field) -> str:
    """The help a field was declared with (setting(help=...)), or "" for a plain field."""
    return f.metadata.get(HELP, "") if f.metadata else ""


# ---------------------------------------------------------------- reading recipes

def _read_yaml(path: Path) -> dict:
    if not path.is_file():
        raise ConfigError(f"recipe not found: {path}")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: invalid YAML: {e}".replace("\n", " ")) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a recipe must be a mapping of keys, got {type(data).__name__}")
    return data


def deep_merge(base: Mapping, override: Mapping) -> dict:
    """A new dict: `override` over `base`, merging nested mappings key by key."""
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def read_recipe(path: str | Path, whole: tuple[str, ...] = (), _chain: tuple[Path, ...] = ()) -> dict:
    """The recipe's mapping with its `base:` chain merged in (base paths are relative to the file).
    A `whole` key the recipe sets replaces the base's, also in the variants it inherits."""
    path = Path(path).expanduser().resolve()
    if path in _chain:
        raise ConfigError(f"recipe inheritance loop: {' -> '.join(str(p) for p in (*_chain, path))}")
    data = _read_yaml(path)
    base = data.pop("base", None)
    if base is None:
        return data
    if not isinstance(base, str):
        raise ConfigError(f"{path}: 'base' must be a path to another recipe, got {base!r}")
    inherited = read_recipe(path.parent / base, whole, (*_chain, path))
    for key in (k for k in whole if k in data):
        inherited.pop(key, None)
        variants = inherited.get("variants")
        if isinstance(variants, Mapping):
            inherited["variants"] = {name: ({k: v for k, v in chosen.items() if k != key}
                                            if isinstance(chosen, Mapping) else chosen)
                                     for name, chosen in variants.items()}
    return deep_merge(inherited, data)


# ---------------------------------------------------------------- overrides

@dataclasses.dataclass(frozen=True)
class _Override:
    """An override value as typed (`text`) and as YAML reads it (`value`).

    We keep the text so that a str field gets exactly what the user wrote:
    `--set tag=1.10` stays "1.10" and `--set mode=on` stays "on" instead of True.
    """

    text: str
    value: Any


def _split_override(item: str) -> tuple[list[str], str]:
    key, sep, text = item.partition("=")
    parts = key.strip().split(".")
    if not sep or not all(p.strip() for p in parts):
        raise ConfigError(f"override {item!r} must look like key.sub=value")
    return [p.strip() for p in parts], text.strip()


def _parse(items: list[str] | None, keep_text: bool) -> dict:
    tree: dict = {}
    for item in items or []:
        parts, text = _split_override(item)
        try:
            value = yaml.safe_load(text)
        except yaml.YAMLError:
            value = text  # not valid YAML (e.g. "a: b: c"): take it literally as a string
        node = tree
        for p in parts[:-1]:
            if not isinstance(node.get(p), dict):
                node[p] = {}
            node = node[p]
        node[parts[-1]] = _Override(text, value) if keep_text and not isinstance(value, dict) else value
    return tree


def move_key(data: dict, old: str, new: str) -> bool:
    """Move the value at dotted key `old` of a nested mapping to dotted key `new` (in place); whether
    it was there. Both set is an error: the two spellings of one setting disagree or repeat.

    >>> d = {"rollout": {"n": 2, "greedy": [1]}}
    >>> move_key(d, "rollout.greedy", "mmoa.greedy"), d
    (True, {'rollout': {'n': 2}, 'mmoa': {'greedy': [1]}})
    """
    *path, leaf = old.split(".")
    node = data
    for part in path:
        node = node.get(part) if isinstance(node, Mapping) else None
    if not isinstance(node, dict) or leaf not in node:
        return False
    *to_path, to_leaf = new.split(".")
    target = data
    for part in to_path:
        target = target.setdefault(part, {})
        if not isinstance(target, dict):
            raise ConfigError(f"config key '{part}' must be a mapping (it holds {new!r})")
    if to_leaf in target:
        raise ConfigError(f"config keys '{old}' and '{new}' are both set: '{old}' is the old name of '{new}'; "
                          f"drop '{old}'")
    target[to_leaf] = node.pop(leaf)
    return True


def parse_overrides(items: list[str] | None) -> dict:
    """["a.b=1", "c=[x, y]"] -> {"a": {"b": 1}, "c": ["x", "y"]} (values read as YAML)."""
    return _parse(items, keep_text=False)


# ---------------------------------------------------------------- type checking

def _type_name(tp: Any) -> str:
    return tp.__name__ if isinstance(tp, type) else str(tp).replace("typing.", "")


def _fail(key: str, tp: Any, value: Any) -> typing.NoReturn:
    raise ConfigError(f"config key '{key}': expected {_type_name(tp)}, got {type(value).__name__} {value!r}")


def _exact_match(value: Any, tp: Any) -> bool:
    """Whether value already has type tp, so that a Union tries that member first."""
    origin = typing.get_origin(tp) or tp
    if origin in (int, float, str, bool):
        return type(value) is origin
    if dataclasses.is_dataclass(origin):
        return isinstance(value, Mapping)
    return isinstance(origin, type) and isinstance(value, origin)


def _unwrap(value: Any) -> Any:
    """An untyped value (e.g. inside `reward: dict`) with every parsed override inside it resolved."""
    if isinstance(value, _Override):
        return value.value
    if isinstance(value, Mapping):
        return {k: _unwrap(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_unwrap(v) for v in value]
    return value


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """`value` checked against (and converted to) the annotation `tp`, or ConfigError."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if isinstance(value, _Override) and origin not in (Union, types.UnionType, Annotated):
        wants_text = tp is str or (origin is Literal and value.text in args)
        value = value.text if wants_text and not isinstance(value.value, str) else value.value
    if tp is Any or tp is object:
        return _unwrap(value)
    if origin is Annotated:
        choices = [m for m in tp.__metadata__ if isinstance(m, Choice)]
        value = _coerce(value, args[0], key)
        for choice in choices:
            known = list(choice.names())
            if value not in known:
                near = difflib.get_close_matches(str(value), [str(a) for a in known], n=1)
                hint = f"; did you mean {near[0]!r}?" if near else ""
                raise ConfigError(f"{key}: {value!r} is not one of {', '.join(map(str, known))}{hint}")
        return value

    if origin in (Union, types.UnionType):  # try the member the value already is first
        parsed = value.value if isinstance(value, _Override) else value
        if parsed is None and type(None) in args:
            return None
        members = sorted((a for a in args if a is not type(None)), key=lambda a: not _exact_match(parsed, a))
        for member in members:
            try:
                return _coerce(value, member, key)
            except ConfigError:
                continue
        _fail(key, tp, parsed)
    if origin is Literal:
        if value in args:
            return value
        near = difflib.get_close_matches(str(value), [str(a) for a in args], n=1)
        hint = f"; did you mean {near[0]!r}?" if near else ""
        raise ConfigError(f"{key}: {value!r} is not one of {', '.join(str(a) for a in args)}{hint}")
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, Mapping):
            _fail(key, tp, value)
        return _build(tp, value, key + ".")
    if tp is bool:
        if isinstance(value, bool):
            return value
        _fail(key, tp, value)
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):  # YAML reads "1e3" as a string
            try:
                f = float(value)
                if f.is_integer():
                    return int(f)
            except ValueError:
                pass
        _fail(key, tp, value)
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML 1.1 reads "1e-5" (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
        _fail(key, tp, value)
    if tp is str:
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
        _fail(key, tp, value)
    if tp is Path:
        if isinstance(value, (str, Path)):
            return Path(value)
        _fail(key, tp, value)
    if origin in (list, tuple, set, frozenset) or tp in (list, tuple, set, frozenset):
        container = origin or tp
        if not isinstance(value, (list, tuple)):
            _fail(key, tp, value)
        if container is tuple and args and args[-1] is not Ellipsis:  # tuple[int, str]: fixed length
            if len(args) != len(value):
                raise ConfigError(f"config key '{key}': expected {len(args)} items, got {len(value)}")
            return tuple(_coerce(v, a, f"{key}[{i}]") for i, (v, a) in enumerate(zip(value, args)))
        item_tp = args[0] if args else Any
        return container(_coerce(v, item_tp, f"{key}[{i}]") for i, v in enumerate(value))
    if origin is dict or tp is dict:
        if not isinstance(value, Mapping):
            _fail(key, tp, value)
        key_tp, val_tp = args if args else (Any, Any)
        return {_coerce(k, key_tp, f"{key}.{k}"): _coerce(v, val_tp, f"{key}.{k}") for k, v in value.items()}
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        try:
            return value if isinstance(value, tp) else tp(value)
        except ValueError:
            raise ConfigError(f"config key '{key}': expected one of {[m.value for m in tp]}, got {value!r}") from None
    if isinstance(tp, type):
        if isinstance(value, tp):
            return value
        _fail(key, tp, value)
    raise ConfigError(f"config key '{key}': unsupported field type {_type_name(tp)}")


def _init_fields(cls: type) -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(cls) if f.init]


def _build(cls: type[T], data: Mapping, prefix: str = "") -> T:
    try:
        hints = typing.get_type_hints(cls, include_extras=True)
    except NameError as e:
        raise ConfigError(f"cannot resolve the field types of {cls.__name__}: {e}") from None
    fields = {f.name: f for f in _init_fields(cls)}
    for key in data:
        if key not in fields:
            close = difflib.get_close_matches(str(key), list(fields), n=3, cutoff=0.6)
            hint = f"; did you mean {' or '.join(repr(prefix + c) for c in close)}?" if close else ""
            raise ConfigError(f"unknown config key '{prefix}{key}'{hint} (valid keys here: {', '.join(fields)})")
    kwargs = {}
    for name, f in fields.items():
        if name in data:
            kwargs[name] = _coerce(data[name], hints[name], prefix + name)
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ConfigError(f"config key '{prefix}{name}' is required but was not given")
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as e:  # __post_init__ validation
        raise ConfigError(f"invalid {prefix.rstrip('.') or cls.__name__} config: {e}") from None


# ---------------------------------------------------------------- public API

def config_from_dict(cls: type[T], data: Mapping) -> T:
    """Build a (nested) dataclass from a plain mapping, checking keys and types."""
    if not dataclasses.is_dataclass(cls):
        raise ConfigError(f"{cls!r} is not a dataclass")
    return _build(cls, data)


def load_config(cls: type[T], path: str | Path | None = None, overrides: list[str] | None = None,
                *, variant: str | None = None, migrate: Callable[[dict], dict] | None = None) -> T:
    """Resolve recipe (+ base chain) + variant + overrides into an instance of `cls`. `migrate` maps
    the merged mapping before it is checked (keys that moved: their old spelling to the new one)."""
    data = read_recipe(path, whole_fields(cls)) if path is not None else {}
    variants = data.pop("variants", None) or {}
    if not isinstance(variants, Mapping):
        raise ConfigError(f"{path}: 'variants' must map a variant name to overrides")
    if variant is not None:
        if path is None:
            raise ConfigError(f"variant {variant!r} was asked for but no recipe file was given")
        if variant not in variants:
            close = difflib.get_close_matches(variant, list(variants), n=3)
            hint = f"; did you mean {' or '.join(map(repr, close))}?" if close else ""
            raise ConfigError(f"{path}: no variant {variant!r}{hint} (variants: {', '.join(variants) or 'none'})")
        chosen = variants[variant] or {}
        if not isinstance(chosen, Mapping):
            raise ConfigError(f"{path}: variant {variant!r} must be a mapping of overrides")
        data = deep_merge(data, chosen)
    # `--set reward={...}` names a whole setting itself: it replaces the recipe's value (a user who
    # writes the whole reward means that reward); `--set reward.f1=0.5` still merges into it.
    for key in {_split_override(item)[0][0] for item in overrides or [] if "." not in item.partition("=")[0]}:
        if key in whole_fields(cls):
            data.pop(key, None)
    data = deep_merge(data, _parse(overrides, keep_text=True))
    return config_from_dict(cls, migrate(data) if migrate is not None else data)


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in _init_fields(type(value))}
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_plain(v) for v in value]
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, Path):
        return str(value)
    return value


def config_to_dict(cfg: Any) -> dict:
    """The config as plain dicts/lists/scalars (what dump_config writes)."""
    if not dataclasses.is_dataclass(cfg) or isinstance(cfg, type):
        raise ConfigError(f"config_to_dict needs a dataclass instance, got {type(cfg).__name__}")
    return _plain(cfg)


def dump_config(cfg: Any, path: str | Path) -> Path:
    """Write the resolved config as YAML; load_config(type(cfg), path) gives it back."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config_to_dict(cfg), sort_keys=False, allow_unicode=True), encoding="utf-8")
    return path
