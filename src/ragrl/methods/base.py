"""The method record: everything the core needs to know about one published method, in one place.

A method is one module (or folder) under `ragrl.methods` that builds a `Method` and calls
`register_method` on it. Registering puts its parts into the core's registries (protocols,
episode runners, rewards, SFT builders, policy setups); the core then finds them by the names a
recipe uses and never names a method itself. A seventh method is its own module plus a recipe.

    register_method(Method(
        name="my_method", paper="Me et al., 2026", trains="the LM that acts",
        protocols=(MyProtocol,), rewards={"my_reward": my_reward}, recipes=("my_method_grpo",),
    ))
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from ragrl.algos.registry import ADVANTAGE_ESTIMATORS, POLICY_LOSSES
from ragrl.policy.base import Policy
from ragrl.errors import ConfigError
from ragrl.registry import Registry
from ragrl.rewards.registry import ANSWER_REWARDS, REWARD_CHECKS, REWARDS
from ragrl.rollout.protocol import PROTOCOLS, TextProtocol, set_default_text_protocol
from ragrl.rollout.runners import RUNNERS

# How a trained run of a method is evaluated (`ragrl eval --run`, `ragrl compare`): an LM agent with
# its adapter and rollout settings; a pipeline of agents; a retriever (encoder) feeding a frozen reader.
Evaluation = Literal["agent", "pipeline", "retriever"]


@dataclass(frozen=True)
class Method:
    """One method's declaration (see the module docstring). Every mapping is name -> object."""

    name: str
    paper: str                                   # citation: authors, venue / arXiv id
    trains: str                                  # what RL trains, in a few words
    protocols: tuple[type[TextProtocol], ...] = ()   # text protocols it adds (registered by .name)
    # Episode runners it adds, for protocols whose episodes are not multi-turn (a pipeline).
    runners: Mapping[str, Callable] = field(default_factory=dict)
    rewards: Mapping[str, Callable[..., float]] = field(default_factory=dict)
    # Checks of a reward's option values, run when a recipe is loaded (before any rollout).
    reward_checks: Mapping[str, Callable[..., None]] = field(default_factory=dict)
    # Its rewards that score a generated answer (refused where no answer is generated).
    answer_rewards: tuple[str, ...] = ()
    # SFT warm-start builders (cfg, model, tokenizer, retriever) -> trajectories: `sft.builder` names.
    sft_builders: Mapping[str, Callable] = field(default_factory=dict)
    # Policy setups it adds (what is trained and how it rolls out): `policy:` names, e.g. retriever;
    # each (cfg, *, retriever, model_bundle, settings) -> Setup.
    setups: Mapping[str, Callable] = field(default_factory=dict)
    # Advantage estimators it adds (`algo.estimator` names): each wrapped by
    # `ragrl.algos.registry.uniform_estimator`, which declares the data it reads.
    estimators: Mapping[str, Callable] = field(default_factory=dict)
    # Policy-gradient losses it adds (`algo.policy_loss` names): (logprobs, old_logprobs,
    # advantages, mask [B, T], algo cfg) -> (scalar loss, stats), like `ragrl.algos.registry.ppo_clip`.
    policy_losses: Mapping[str, Callable] = field(default_factory=dict)
    # Its own settings: a dataclass of `ragrl.yaml_config.setting` fields, read from the recipe's
    # top-level section named `settings_key` (the method's name unless given), typed and checked on
    # load like the core's sections (an unknown key is refused with "did you mean"), written into
    # every run's config.yaml, and passed to its runner, setups, check and preflight as `settings`.
    settings: type | None = None
    settings_key: str | None = None
    # Keys its settings had before they were its own: old dotted key -> key in its section. A recipe
    # or run config that still uses one is read as the new key, with a deprecation message.
    moved_keys: Mapping[str, str] = field(default_factory=dict)
    # Intervals of its numeric settings (keys within its section): refused on load, as the core's.
    ranges: Mapping[str, str] = field(default_factory=dict)
    # (settings) -> settings as evaluation runs its episodes: a training-only knob at its
    # evaluation value (one sample a branch). None: evaluation reads them as trained.
    evaluation_settings: Callable[[Any], Any] | None = None
    # Checks of the settings this method owns, (cfg, settings), run on every resolved config (so its
    # settings are refused where they would be ignored, and bad combinations of them before any work).
    check: Callable[[Any, Any], None] | None = None
    # For a policy setup of its own: (settings) -> whether its runs generate text (so can make
    # format errors). None: they do not (an LM agent's runs always do).
    writes_text: Callable[[Any], bool] | None = None
    # Metrics it adds to the training curves (curves.png), beyond the core's.
    plot_keys: tuple[str, ...] = ()
    # Metrics its evaluation adds, from the answering trajectories (MMOA-RAG: selector F1).
    eval_metrics: Callable[[list], dict] | None = None
    # `ragrl train --check`, (cfg, settings): the files, indexes and models its setup would open,
    # one line each.
    preflight: Callable[[Any, Any], list[str]] | None = None
    evaluation: Evaluation = "agent"
    # evaluation "retriever": its settings carry `encoder`, `hops`, `history`, `instruction`,
    # `generator` and `generator_adapter`, which the evaluations read; and
    # eval_retriever: (cfg, trained encoder dir | None for the start[, dense backend already loaded])
    # -> the run's retriever as evaluated (deterministic top k, its own index); `.searcher(hops)`
    # gives every hop's passages.
    eval_retriever: Callable[[Any, Any], Any] | None = None
    # What its reward charges per retrieval, from a resolved config (None: no charge in this run):
    # `ragrl compare` sets it beside the break-even cost at which the run's searching stops paying.
    retrieval_cost: Callable[[Any], float | None] | None = None
    recipes: tuple[str, ...] = ()                # its shipped recipes (ragrl/recipes/<name>.yaml)
    # Its protocol reads plain text when a reward is given neither a trajectory nor a protocol.
    default_text_protocol: bool = False

    @property
    def section(self) -> str | None:
        """The recipe key of its settings (None: it has none)."""
        return (self.settings_key or self.name) if self.settings is not None else None


METHODS: Registry[Method] = Registry("method")
# `sft.builder` names -> (cfg, model, tokenizer, retriever) -> warm-start trajectories: the core's
# `gold_search` (ragrl.methods.synthetic) and what each method adds.
SFT_BUILDERS: Registry[Callable] = Registry("SFT builder")
# `policy` names -> (cfg, *, retriever, model_bundle, settings) -> Setup: the core's `lm`
# (ragrl.methods.lm_setup) and what each method adds (HARR's `retriever`).
POLICY_SETUPS: Registry[Callable] = Registry("policy setup")


@dataclass
class Setup:
    """What the trainer trains, and how it rolls out, evaluates and exports it: built by a policy
    setup (`policy: lm`, the core's, or one a method adds) from the resolved config.

        trajs, stats = setup.rollout(samples, rollout_cfg, group_offset)
        setup.policy                    # a ragrl.policy.Policy: collate / forward / reference
        setup.evaluate(samples, seed, per_question)   # held-out metrics (percent, 95% CIs)
        setup.export(target_dir, gathered_state | None)   # what a later stage or `ragrl eval` loads
    """

    policy: Policy
    rollout: Callable          # (samples, RolloutConfig, group_offset) -> (trajectories, stats)
    evaluate: Callable         # (samples, seed, per_question) -> dict of metrics
    export: Callable           # (target_dir, gathered_state | None) -> None
    artifact: str = "adapter"  # what export writes: run_dir/final_<artifact>, best_<artifact>
    shardable: bool = True     # whether FSDP may shard policy.module
    trains: Callable = lambda traj: True   # which rolled-out trajectories the update learns from
    # Before the first step: the training questions to keep, (questions, reward_fn, run_dir, writer)
    # -> questions (HARR's filter); None keeps them all.
    select_questions: Callable | None = None
    extras: dict = field(default_factory=dict)   # the engine, retriever, sampler... for callers


def _parts(method: Method) -> list[tuple[Registry, Mapping[str, Any]]]:
    """Each core registry the method fills, with what it puts there (name -> entry)."""
    return [(PROTOCOLS, {p.name: p for p in method.protocols}), (RUNNERS, method.runners),
            (REWARDS, method.rewards), (REWARD_CHECKS, method.reward_checks),
            (ADVANTAGE_ESTIMATORS, method.estimators), (POLICY_LOSSES, method.policy_losses),
            (SFT_BUILDERS, method.sft_builders), (POLICY_SETUPS, method.setups)]


def register_method(method: Method) -> Method:
    """Put the method's parts into the core's registries; returns the method (for module constants).

    Names must be new: a second method may not silently replace a protocol, reward, SFT builder,
    policy setup or settings section of another (nor the core's `gold_search` builder or `lm` setup).
    Every part is checked before any is registered, so a refused method leaves no part behind."""
    for registry, entries in _parts(method):
        taken = registry.registered()
        clash = sorted(name for name, entry in entries.items() if name in taken and taken[name] is not entry)
        if clash:
            raise ConfigError(f"{registry.what} {clash[0]!r} is registered twice")
    owner = next((m for m in METHODS.values() if method.section and m.section == method.section), method)
    if owner is not method:
        raise ConfigError(f"settings section {method.section!r} is registered twice")
    if method.settings is not None and not dataclasses.is_dataclass(method.settings):
        raise ConfigError(f"method {method.name}: settings must be a dataclass, got {method.settings!r}")
    for registry, entries in _parts(method):
        for name, entry in entries.items():
            registry.register(name, entry)
    if method.default_text_protocol:
        set_default_text_protocol(method.protocols[0].name)
    METHODS.register(method.name, method)
    return method


def unregister_method(name: str) -> None:
    """Take a method's parts out of the registries again (a method defined in a test)."""
    method = METHODS.get(name)
    if method is None:
        return
    METHODS.unregister(name)
    for registry, entries in _parts(method):
        for n in entries:
            registry.unregister(n)


def method_for(protocol: str, setup: str) -> Method | None:
    """The method a run belongs to: the one that adds its policy setup (HARR's `retriever`), else
    the one that adds its protocol; None for a protocol no method declares."""
    for method in METHODS.values():
        if setup in method.setups:
            return method
    for method in METHODS.values():
        if any(p.name == protocol for p in method.protocols):
            return method
    return None


def settings_of(cfg, method: Method | None) -> Any:
    """The method's own settings section of a resolved config (None: no method, or it has none)."""
    return getattr(cfg, method.section) if method is not None and method.section else None


def runner_settings(cfg, runner: str, evaluation: bool = False) -> Any:
    """What the episode runner named `runner` is given as its `settings`: the section of the method
    that adds the runner (None for the core's multi_turn), at its evaluation values when `evaluation`."""
    method = next((m for m in METHODS.values() if runner in m.runners), None)
    settings = settings_of(cfg, method)
    if evaluation and settings is not None and method.evaluation_settings is not None:
        settings = method.evaluation_settings(settings)
    return settings


def answer_rewards() -> set[str]:
    """The rewards that score a generated answer: the core's and every method's."""
    return set(ANSWER_REWARDS) | {r for m in METHODS.values() for r in m.answer_rewards}
