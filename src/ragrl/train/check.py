"""Validate a resolved config before any costly work: what `ragrl train RECIPE --check` runs, and
what every run checks first. Each problem is one sentence naming the setting."""
from __future__ import annotations

import json
import math
from dataclasses import fields
from pathlib import Path

from ragrl.algos.registry import ADVANTAGE_ESTIMATORS
from ragrl.datasets import load_questions
from ragrl.engines.registry import require_engine
from ragrl.errors import ConfigError
from ragrl.methods.base import METHODS, method_for, settings_of
from ragrl.kit import verify_kit
from ragrl.models.lm_weights import resolve_policy
from ragrl.paths import KIT_PREFIX, resolve_kit
from ragrl.policy.lm_model import resolve_device
from ragrl.retrieval.corpus import file_sha256, load_corpus
from ragrl.retrieval.resolve import corpus_of
from ragrl.rewards.registry import PASSAGE_TEXT_REWARDS, REWARDS, make_reward
from ragrl.rollout.config import check_forced_turns
from ragrl.rollout.protocol import get_protocol
from ragrl.train.config import TrainConfig
from ragrl.train.setup import default_retriever
from ragrl.train.trackers import check_trackers

# Numeric settings and the values that mean something, as intervals ("[1, inf)", "(0, 1]"). The typed
# loader checks the type; these catch what would fail only after a step of work (save_every=0
# divides by zero at the first save, algo.clip_low=1 is refused at the first update) or be ignored
# in silence (rollout.n=0 samples nothing, a negative entropy_coef is never applied). An unset
# optional (None) passes; NaN and infinity never do. Left out on purpose: seed and rollout.seed (any
# integer). A method's own settings have their own (`Method.ranges`, read by all_ranges).
RANGES: dict[str, str] = {
    **dict.fromkeys((
        "steps", "questions_per_step", "save_every", "keep_last", "data.eval_n", "model.lora_r",
        "model.lora_alpha", "model.lora_layers", "model.max_batch_size", "algo.ppo_epochs", "algo.minibatch_size",
        "algo.micro_batch_size", "sft.batch_size", "sft.max_len", "sft.max_questions", "rollout.n", "rollout.max_turns",
        "rollout.max_turn_tokens", "rollout.max_response_tokens", "rollout.max_obs_tokens",
        "rollout.passage_words", "rollout.max_queries_per_call", "rollout.topk", "rollout.end_after_searches",
        "algo.kl_horizon",
        "guard.nonfinite_steps", "guard.window", "guard.patience"), "[1, inf)"),
    **dict.fromkeys((
        "warmup_steps", "experts_per_group", "weight_decay", "critic_warmup", "eval_every", "log_trajectories_every", "sft.steps",
        "algo.clip_high", "algo.kl_coef", "algo.value_coef", "algo.entropy_coef", "rollout.max_searches",
        "rollout.temperature",
        "guard.entropy_floor", "guard.max_rollbacks", "guard.retrieval_wait_s"), "[0, inf)"),
    **dict.fromkeys(("lr", "sft.lr", "max_grad_norm", "algo.kl_target",
                     "algo.value_clip", "guard.kl_ceiling", "guard.reward_drop", "rollout.max_episode_s",
                     "rollout.max_rollout_s", "guard.rank_silence_s", "guard.collective_timeout_s"), "(0, inf)"),
    **dict.fromkeys(("guard.remedy_lr_factor",), "(0, 1]"),
    **dict.fromkeys(("guard.format_error_ceiling",), "[0, 1)"),
    "guard.timeout_reward": "(-inf, inf)",
    **dict.fromkeys(("algo.gamma", "algo.lam"), "[0, 1]"),
    # dropout 1 zeroes LoRA's input; direct_frac 1 leaves no search episode (warm_start_episodes agrees)
    **dict.fromkeys(("algo.clip_low", "model.lora_dropout", "ema_decay", "sft.direct_frac"), "[0, 1)"),
    "rollout.top_p": "(0, 1]",
    "algo.dual_clip": "(1, inf)",   # the dual-clip bound c > 1 (below 1 it would clip every sample)
}


def _within(value: float, interval: str) -> bool:
    """Whether value lies in an interval written "[a, b)" (a, b numbers or inf).

    >>> _within(0, "[0, 1)"), _within(1, "[0, 1)"), _within(0, "(0, inf)"), _within(float("inf"), "[1, inf)")
    (True, False, False, False)
    """
    lo, hi = (float(x) for x in interval[1:-1].split(","))
    above = value > lo if interval[0] == "(" else value >= lo
    below = value < hi if interval[-1] == ")" else value <= hi
    return math.isfinite(value) and above and below


def _say(interval: str) -> str:
    """ "[1, inf)" -> ">= 1", "(0, inf)" -> "> 0", bounded intervals as written."""
    if interval.endswith("inf)"):
        return (">= " if interval[0] == "[" else "> ") + interval[1:].split(",")[0]
    return f"in {interval}"


def all_ranges() -> dict[str, str]:
    """The core's RANGES and every method's own (`Method.ranges`), under its section's key."""
    return {**RANGES, **{f"{m.section}.{k}": v for m in METHODS.values() if m.section for k, v in m.ranges.items()}}


def check_ranges(cfg: TrainConfig) -> None:
    """Every numeric setting in all_ranges() within its interval; the first one outside is named with it."""
    for key, interval in all_ranges().items():
        value = cfg
        for part in key.split("."):
            value = getattr(value, part)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):   # a config built in code
            raise ConfigError(f"{key} must be a number, got {value!r}")
        if not _within(value, interval):
            raise ConfigError(f"{key} must be {_say(interval)}, got {value!r}")


def check_combinations(cfg: TrainConfig) -> None:
    """Settings that load but cannot work together (cheap: no file or model is opened)."""
    check_ranges(cfg)
    a = cfg.algo
    needs = ADVANTAGE_ESTIMATORS[a.estimator].needs   # the estimator's name was checked on load
    if a.kl_in_reward and a.kl_coef > 0 and "token_rewards" not in needs:
        raise ConfigError(f"algo.kl_in_reward: the {a.estimator} estimator reads only the outcome score, so a KL "
                          f"penalty in the token rewards would do nothing; set algo.kl_in_reward=false (KL in the loss)")
    if not a.has_critic:
        given = [k for k in ("value_coef", "value_clip") if getattr(a, k) is not None]
        if given:
            raise ConfigError(f"algo.{given[0]}: the {a.estimator} estimator has no critic, so there is no value "
                              "loss to weigh or clip; drop it or use algo.estimator=gae")
    elif a.critic[0] <= 0:
        raise ConfigError(f"algo.value_coef: {a.estimator} reads its critic's values, and value_coef 0 would leave "
                          "the critic at its random start; set value_coef > 0")
    if (cfg.policy == "lm" and cfg.sft.steps > 0 and cfg.sft.builder == "gold_search_missed"
            and get_protocol(cfg.agent).max_queries > 1):
        raise ConfigError(f"sft.builder=gold_search_missed writes one query a search, and agent {cfg.agent} "
                          f"writes several at once: use sft.builder=gold_search")
    if cfg.policy == "lm" and cfg.sft.steps > 0 and cfg.sft.builder == "missed_after_question":
        r = cfg.rollout
        if r.first_action != "question" or r.second_action != "search" or get_protocol(cfg.agent).max_queries > 1:
            raise ConfigError(f"sft.builder=missed_after_question writes the episode rollout.first_action=question "
                              f"with second_action=search makes (one query a search); this run has first_action="
                              f"{r.first_action}, second_action={r.second_action}, agent {cfg.agent}: set those, "
                              "or use sft.builder=gold_search_missed")
    if cfg.policy == "lm" and cfg.sft.steps > 0 and cfg.rollout.title_notes != "none":
        raise ConfigError(f"rollout.title_notes={cfg.rollout.title_notes} writes the candidate titles' notes into "
                          f"the second search's thought, and the SFT episodes (sft.builder={cfg.sft.builder}) write "
                          "that thought without them, so the warm start would learn a context no rollout shows: "
                          "set sft.steps=0, or title_notes: none")
    if "group_ids" in needs and cfg.rollout.n < 2:
        # A group is one prompt's rollout.n samples: alone in its group, every sample's advantage is 0.
        raise ConfigError(f"algo.estimator={a.estimator} compares each sample with the other samples of its "
                          f"prompt; with rollout.n={cfg.rollout.n} every advantage is 0 and nothing is learned: "
                          "set rollout.n >= 2 or use a critic (gae) or reinforce_pp")
    if a.drop_flat_groups and set(needs) - {"logprobs"} != {"scores", "group_ids", "mask"}:
        # reinforce_pp_baseline whitens over the batch and a critic's GAE reads values: a flat
        # group's advantages are not 0 there, so leaving it out would change the update.
        raise ConfigError(f"algo.drop_flat_groups: a flat group's advantage is 0 only under an estimator that "
                          f"reads its group's scores alone (grpo, dr_grpo, rloo, enumerated), not {a.estimator}; drop it "
                          "or change algo.estimator")
    if (a.estimator == "enumerated") != (cfg.rollout.title_group == "every"):
        # A sampled group weighed as if it held each option once, or options weighed as if sampled: biased.
        raise ConfigError(f"algo.estimator={a.estimator} with rollout.title_group={cfg.rollout.title_group}: the "
                          "enumerated estimator weighs a group holding each title once (title_group: every) by "
                          "the policy's probability of it, and such a group is no sample for the others; set "
                          "both (estimator: enumerated, title_group: every) or neither")
    if cfg.critic_warmup:
        if not a.has_critic:
            raise ConfigError(f"critic_warmup: the {a.estimator} estimator has no critic to warm up; "
                              "drop it or use algo.estimator=gae")
        if not 0 < cfg.critic_warmup < cfg.steps:
            raise ConfigError(f"critic_warmup must be between 1 and steps - 1 ({cfg.steps - 1}); got "
                              f"{cfg.critic_warmup} (the policy would never be trained)")
    require_engine(cfg.model.engine)
    if cfg.model.engine == "vllm" and cfg.shard_params:
        raise ConfigError("model.engine=vllm holds the whole model on one GPU to generate; it cannot follow "
                          "FSDP-sharded weights: set shard_params=false or model.engine=hf")
    if a.kl_target is not None and a.kl_coef <= 0:
        raise ConfigError("algo.kl_target adapts algo.kl_coef, which is 0: set algo.kl_coef > 0 or drop kl_target")
    if cfg.model.reference_adapter and not cfg.model.init_adapter:
        raise ConfigError("model.reference_adapter replaces model.init_adapter as the run's frozen start; "
                          "set model.init_adapter too (or drop reference_adapter)")
    if cfg.model.reference_adapter and not (Path(cfg.model.reference_adapter) / "adapter_config.json").is_file():
        raise ConfigError(f"model.reference_adapter: {cfg.model.reference_adapter} is not a LoRA adapter folder "
                          "(no adapter_config.json)")
    if cfg.model.init_adapter and not (Path(cfg.model.init_adapter) / "adapter_config.json").is_file():
        raise ConfigError(f"model.init_adapter: {cfg.model.init_adapter} is not a LoRA adapter folder "
                          "(no adapter_config.json)")
    if cfg.model.init_adapter and not cfg.model.lora:
        raise ConfigError("model.init_adapter needs model.lora=true (it starts a LoRA adapter from that folder)")
    if cfg.ema_decay and cfg.shard_params:
        raise ConfigError("ema_decay: weight averaging of FSDP-sharded parameters is not supported; "
                          "set ema_decay=0 or shard_params=false")
    if cfg.keep_best and not cfg.eval_every:
        raise ConfigError("keep_best needs eval_every > 0: the best policy is chosen at the periodic evaluations")
    if cfg.eval_start and not cfg.eval_every:
        raise ConfigError("eval_start needs eval_every > 0: the start is evaluated as the baseline of the "
                          "periodic evaluations, and there are none")
    check_agents(cfg)
    check_first_action(cfg)
    check_second_action(cfg)
    check_last_action(cfg)
    check_query_prefix(cfg)
    check_forced_turns(cfg.rollout)   # after the three: a protocol that lacks the tags is named first
    check_answer_by(cfg)
    check_experts(cfg)
    check_guards(cfg)
    check_trackers(cfg.report_to)   # a tracker asked for is installed, and named once
    for start, spec in (cfg.reward_schedule or [[0, cfg.reward]]):
        check_search_outcome_rewards(cfg, make_reward(spec))   # a typo fails here, not after the SFT warm start
    check_method_sections(cfg)
    # Each method checks the settings it owns, on every config: its settings are refused where they
    # would be ignored, and its own combinations before any work.
    for method in METHODS.values():
        if method.check is not None:
            method.check(cfg, settings_of(cfg, method))
    check_index_matches_corpus(cfg)


def check_method_sections(cfg: TrainConfig) -> None:
    """A method's own section set away from its defaults in another method's run would be ignored:
    refused, naming the first such key."""
    own = method_for(cfg.agent, cfg.policy)
    for method in METHODS.values():
        section = settings_of(cfg, method)
        if method is own or section is None:
            continue
        default = method.settings()
        if section == default:
            continue
        changed = next(f.name for f in fields(section) if getattr(section, f.name) != getattr(default, f.name))
        raise ConfigError(f"{method.section}.{changed} is a setting of {method.paper.split(' (')[0]}, read by its "
                          f"runs only, and this run is {own.name if own else cfg.agent} (agent {cfg.agent}, policy "
                          f"{cfg.policy}): drop it")


def check_search_outcome_rewards(cfg: TrainConfig, reward) -> None:
    """The rewards on what a search found act where an LM's searches record their queries and their
    passages' texts: refused for a retriever policy (search_gain's baseline is the LM's question-as-query
    search; query_rank searches the LM's own queries) and for a protocol whose runner records passage
    ids only (a pipeline)."""
    # The rewards that search an LM episode's own queries again declare it (needs_query_rank), as the
    # trainer's scoring phase reads it.
    own = [t.name for t in reward.terms if getattr(REWARDS[t.name], "needs_query_rank", False)]
    used = [t.name for t in reward.terms if t.name in PASSAGE_TEXT_REWARDS] + own
    if not used:
        return
    if cfg.policy != "lm" and "search_gain" in used:
        raise ConfigError(f"reward search_gain compares an LM agent's searches with its question's own search; "
                          f"a {cfg.policy} policy has no such agent: use answer_rank or gold_recall")
    if cfg.policy != "lm" and own:
        raise ConfigError(f"reward {own[0]} searches again the queries an LM agent wrote; a {cfg.policy} "
                          f"policy writes none: use answer_rank or gold_recall")
    runner = get_protocol(cfg.agent).runner if cfg.policy == "lm" else "retrieval_only"
    if runner not in ("multi_turn", "retrieval_only"):
        raise ConfigError(f"reward {used[0]} reads each search's queries or passages' texts, which the {runner} "
                          f"runner of protocol {cfg.agent!r} does not record: use gold_recall or answer_in_docs")


def _multi_turn_protocol(cfg: TrainConfig):
    """The run's protocol where an LM plays it turn by turn (the core's multi_turn runner), else None."""
    protocol = get_protocol(cfg.agent) if cfg.policy == "lm" else None
    return protocol if protocol is not None and protocol.runner == "multi_turn" else None


def _require_protocol_part(cfg: TrainConfig, part: str, setting_does: str, lacks: str, instead: str) -> None:
    """Refuse a rollout setting that acts on the protocol's `part` (its query or answer tags) for a run
    whose policy plays no multi-turn protocol with that part."""
    protocol = _multi_turn_protocol(cfg)
    if protocol is None or getattr(protocol, part) is None:
        raise ConfigError(f"{setting_does}, but agent {cfg.agent!r} (policy {cfg.policy}) has no {lacks}; "
                          f"set {instead}")


def check_first_action(cfg: TrainConfig) -> None:
    """rollout.first_action=search (or question) needs an LM policy whose multi-turn protocol has a search
    action and a warm start that teaches no direct answer (sft.direct_frac): the rollout would never
    allow one. Its turns are checked with the other forced turns (check_forced_turns)."""
    first = cfg.rollout.first_action
    if first == "free":
        return
    does = ("opens each episode with a search for the policy to finish" if first == "search" else
            "opens each episode with the runner's own search of the question")
    _require_protocol_part(cfg, "query", f"rollout.first_action={first} {does}", "multi-turn search action",
                           "rollout.first_action=free")
    if cfg.sft.steps and cfg.sft.direct_frac:
        raise ConfigError(f"sft.direct_frac={cfg.sft.direct_frac} teaches answers without a search, which "
                          f"rollout.first_action={first} never lets the policy give; set sft.direct_frac=0")


def check_second_action(cfg: TrainConfig) -> None:
    """rollout.second_action=search needs an LM policy whose multi-turn protocol has a search action (its
    turns: check_forced_turns)."""
    if cfg.rollout.second_action != "search":
        return
    _require_protocol_part(cfg, "query", "rollout.second_action=search opens each episode's second turn with a "
                           "search for the policy to finish", "multi-turn search action", "rollout.second_action=free")


def check_last_action(cfg: TrainConfig) -> None:
    """rollout.last_action=answer needs an LM policy whose multi-turn protocol has tagged answers (its
    turns: check_forced_turns)."""
    if cfg.rollout.last_action != "answer":
        return
    _require_protocol_part(cfg, "answer", "rollout.last_action=answer opens each episode's last turn with an "
                           "answer tag", "tagged answer turn", "rollout.last_action=free")


def check_answer_by(cfg: TrainConfig) -> None:
    """rollout.answer_by=start (base, reader) needs an LM policy that plays multi-turn episodes with tagged
    answers, a LoRA adapter (the start is kept as a frozen adapter beside it; the base is the model with
    every adapter off) and an engine that can switch to it."""
    writer = cfg.rollout.answer_by
    if writer == "policy":
        return
    _require_protocol_part(cfg, "answer", f"rollout.answer_by={writer} lets the run's {writer} write the answers "
                           "of a multi-turn agent", "tagged answer turn", "rollout.answer_by=policy")
    if not cfg.model.lora:
        raise ConfigError(f"rollout.answer_by={writer} needs model.lora=true: the {writer} writes the answers with "
                          "the trained adapter switched off, and a full fine-tune has none to switch")
    if cfg.model.engine not in ("auto", "hf"):
        raise ConfigError(f"rollout.answer_by={writer} switches LoRA adapters between calls, which model.engine="
                          f"{cfg.model.engine} cannot: set model.engine=hf (or auto)")


def check_query_prefix(cfg: TrainConfig) -> None:
    """rollout.query_prefix=question searches the question before each query the policy writes: it needs
    an LM policy whose multi-turn protocol has a search action, a free second query (a title choice is
    searched its own way), and no warm start or expert episodes, whose searches are their queries as
    written (the policy would learn from passages no rollout of it shows)."""
    if cfg.rollout.query_prefix == "none":
        return
    does = "rollout.query_prefix=question searches the question followed by each query the policy writes"
    _require_protocol_part(cfg, "query", does, "multi-turn search action", "rollout.query_prefix=none")
    if cfg.rollout.second_query != "free":
        raise ConfigError(f"{does}, and rollout.second_query={cfg.rollout.second_query} chooses the second query "
                          "among titles, searched its own way: set one of them (second_query: question_title "
                          "searches the question and the title)")
    if cfg.sft.steps > 0 or cfg.experts_per_group > 0:
        what = f"sft.steps={cfg.sft.steps}" if cfg.sft.steps > 0 else f"experts_per_group={cfg.experts_per_group}"
        raise ConfigError(f"{does}, and {what} writes episodes whose searches are their queries as written, so "
                          "the policy would learn from passages no rollout of it shows: set sft.steps=0 and "
                          "experts_per_group=0, or query_prefix: none")


def check_experts(cfg: TrainConfig) -> None:
    """experts_per_group > 0 needs an LM policy whose multi-turn protocol has a search action (the expert
    episode is that protocol's gold search episode), and a group-relative estimator to compare it in."""
    n = cfg.experts_per_group
    if n == 0:
        if cfg.experts_query != "every_gold":
            raise ConfigError(f"experts_query={cfg.experts_query} says what expert episodes search, but "
                              "experts_per_group=0 adds none; set experts_per_group or drop experts_query")
        return
    protocol = get_protocol(cfg.agent) if cfg.policy == "lm" else None
    if protocol is None or protocol.runner != "multi_turn" or protocol.query is None:
        raise ConfigError(f"experts_per_group={n} adds gold search episodes to each group, but agent {cfg.agent!r} "
                          f"(policy {cfg.policy}) has no multi-turn search action; set experts_per_group=0")
    if "group_ids" not in ADVANTAGE_ESTIMATORS[cfg.algo.estimator].needs:
        raise ConfigError(f"experts_per_group={n}: an expert episode joins its question's group, and "
                          f"algo.estimator={cfg.algo.estimator} compares no group; use a group estimator "
                          "(grpo, rloo, dr_grpo, ...) or set experts_per_group=0")
    if cfg.experts_query == "missed_gold" and protocol.max_queries > 1:
        raise ConfigError(f"experts_query=missed_gold writes one query a search; {protocol.name} writes "
                          f"{protocol.max_queries} (use experts_query=every_gold)")


def check_guards(cfg: TrainConfig) -> None:
    """A guard set where it could never act is refused, not kept in silence."""
    g, r = cfg.guard, cfg.rollout
    if g.kl_ceiling is not None and cfg.algo.kl_coef <= 0:
        raise ConfigError("guard.kl_ceiling watches the KL to the reference, which is not computed with "
                          "algo.kl_coef=0: set algo.kl_coef > 0 or drop guard.kl_ceiling")
    method = method_for(cfg.agent, cfg.policy)
    generates = cfg.policy == "lm" or bool(method and method.writes_text and method.writes_text(settings_of(cfg, method)))
    if g.format_error_ceiling is not None and not generates:
        raise ConfigError(f"guard.format_error_ceiling: a {cfg.policy} policy with no generator writes no text, "
                          "so it makes no format errors; drop guard.format_error_ceiling")
    if g.reward_drop is not None and g.window >= cfg.steps:
        raise ConfigError(f"guard.reward_drop compares a step's reward with the mean of the {g.window} steps before "
                          f"it (guard.window), and the run has only {cfg.steps} steps: lower guard.window")
    bounds = [k for k in ("max_episode_s", "max_rollout_s") if getattr(r, k) is not None]
    if bounds and cfg.model.engine == "vllm":
        raise ConfigError(f"rollout.{bounds[0]}: vLLM's engine cannot cut a row at a wall-time bound; "
                          "use model.engine=hf or static (or auto), or drop the bound")
    if g.timeout_reward is not None and not bounds:
        raise ConfigError("guard.timeout_reward scores episodes cut by rollout.max_episode_s or max_rollout_s, "
                          "and neither is set: set one or drop guard.timeout_reward")


def check_index_matches_corpus(cfg: TrainConfig) -> None:
    """A warm start reads gold passages from data.corpus while the rollouts search data.index: the
    index must have been built over that corpus. (Without SFT, data.corpus only says what to index
    when data.index is null, so overriding data.index alone stays possible.) A URL is not checked."""
    spec = cfg.data.index
    if not spec or "://" in spec or not cfg.data.corpus or cfg.policy != "lm" or cfg.sft.steps <= 0:
        return
    folder = resolve_kit(spec)
    try:
        manifest = json.loads((folder / "manifest.json").read_text())
    except (OSError, ValueError) as error:
        raise ConfigError(f"data.index: {spec} is not a readable index folder ({error})") from None
    corpus = resolve_kit(cfg.data.corpus)
    if manifest.get("corpus_sha256") != file_sha256(corpus):
        raise ConfigError(f"data.index: {spec} was built over {manifest.get('corpus_path', 'another corpus')}, "
                          f"whose contents differ from data.corpus ({corpus}): rebuild the index from "
                          "data.corpus, or point data.corpus at the index's corpus")


def check_everything(cfg: TrainConfig) -> list[str]:
    """`--check`: the combinations, then every file, index, model and device the run would open
    (without loading model weights or training). Returns what was checked, one line each."""
    check_combinations(cfg)
    done = []
    kit_files = sorted({v for v in (cfg.data.train, cfg.data.eval, cfg.data.index, cfg.data.corpus, cfg.data.vectors)
                        if isinstance(v, str) and v.startswith(KIT_PREFIX)})
    if kit_files:   # the run reads the data kit: every file of it as its manifest says (sha256)
        kit = verify_kit()
        done.append(f"data kit: {kit.root} ({kit.origin}), {sum(f.status == 'ok' for f in kit.files)} files "
                    f"verified; this run reads {', '.join(kit_files)}")
    for key in ("train", "eval"):
        rows = load_questions(getattr(cfg.data, key))
        done.append(f"data.{key}: {len(rows)} questions")
        if key == "train" and (line := check_warm_start_gold(cfg, rows)):
            done.append(line)
    done.append(f"model.device: {resolve_device(cfg.model.device)}")
    if cfg.policy == "lm":
        done.append(f"model: {cfg.model.name} -> {resolve_policy(cfg.model.name)}")
    method = method_for(cfg.agent, cfg.policy)
    if cfg.policy != "lm" and method is not None and method.preflight is not None:
        done += method.preflight(cfg, settings_of(cfg, method))   # a method's own setup opens its own files
    else:
        retriever = default_retriever(cfg)
        try:
            n = len(retriever)
        except TypeError:
            n = "remote"
        done.append(f"retriever: {n} passages")
    for start, spec in (cfg.reward_schedule or [[0, cfg.reward]]):
        done.append(f"reward from step {start}: {make_reward(spec)!r}")
    return done


def check_warm_start_gold(cfg: TrainConfig, rows: list[dict]) -> str | None:
    """The core's SFT warm start (sft.builder gold_search) and the expert episodes (experts_per_group)
    are built from the training questions' gold_passage_ids, looked up in the corpus the run searches:
    a file without them fails only once the model has loaded, and ids the corpus lacks would build
    on no gold passage at all."""
    sft = (cfg.policy == "lm" and cfg.sft.steps > 0 and not cfg.model.init_adapter
           and cfg.sft.builder in ("gold_search", "gold_search_missed"))
    if not sft and not cfg.experts_per_group:
        return None
    what, user, off = ((f"sft.steps={cfg.sft.steps}", "the SFT warm start", "sft.steps=0 to start RL from the base model")
                       if sft else (f"experts_per_group={cfg.experts_per_group}", "the expert episodes",
                                    "experts_per_group=0"))
    gold = {pid for r in rows for pid in r.get("gold_passage_ids") or []}
    if not gold:
        raise ConfigError(f"{what}: {user} need training questions with gold_passage_ids, and {cfg.data.train} "
                          f"has none: add them, or --set {off}")
    path = corpus_of(cfg.data.index, cfg.data.corpus)
    corpus = load_corpus(path)
    found = sum(isinstance(pid, str) and corpus.row(pid) is not None for pid in gold)
    if not found:
        raise ConfigError(f"{what}: none of the {len(gold)} gold_passage_ids of "
                          f"{cfg.data.train} is a passage id of {path} (the corpus the run searches, e.g. "
                          f"{sorted(map(str, gold))[0]!r}); point data.index or data.corpus at their corpus, "
                          f"or --set {off}")
    with_gold = sum(bool(r.get("gold_passage_ids")) for r in rows)
    return (f"{'SFT warm start' if sft else 'Expert episodes'}: {with_gold} training questions with gold passages "
            f"({found} of {len(gold)} ids in {path.name})")


def check_agents(cfg: TrainConfig) -> None:
    """frozen_agents and agent_adapters name agents the protocol has (MMOA-RAG's three)."""
    agents = tuple(get_protocol(cfg.agent).agents)
    unknown = [a for a in cfg.frozen_agents if a not in agents]
    if unknown:
        raise ConfigError(f"frozen_agents: {', '.join(map(repr, unknown))} is not an agent of {cfg.agent!r} "
                          f"(its agents: {', '.join(agents) or 'none, it is a single policy'})")
    if not cfg.frozen_agents and cfg.agent_adapters == "shared":
        return
    if cfg.agent_adapters == "per_agent":
        cannot = [(not agents, f"agent {cfg.agent!r} is a single policy"),
                  (not cfg.model.lora, "model.lora is false"),
                  (cfg.model.engine not in ("hf", "auto"),
                   f"model.engine is {cfg.model.engine} (only hf switches adapters per agent; auto picks it)"),
                  (cfg.shard_params is True, "shard_params is true (FSDP with several adapters is untested)")]
        why = next((reason for applies, reason in cannot if applies), None)
        if why:
            raise ConfigError(f"agent_adapters=per_agent gives each agent its own LoRA adapter, but {why}; "
                              "use agent_adapters=shared")
