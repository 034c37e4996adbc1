"""HARR (Reinforcement Fine-Tuning for History-Aware Dense Retriever in RAG): the retriever is the
policy. Each search is a Plackett–Luce draw from the query encoder's candidate pool; later searches
embed the question with the history of what earlier ones found; the generator stays frozen."""
from __future__ import annotations

from ragrl.errors import ConfigError
from ragrl.methods.base import Method, answer_rewards, register_method
from ragrl.methods.harr.settings import RANGES, RetrieverSettings
from ragrl.methods.harr.setup import eval_retriever, preflight, retriever_setup


def check_harr_settings(cfg, settings: RetrieverSettings) -> None:
    """A retriever policy with no generator has no answer to score; hops are for generator-free runs."""
    rc = settings
    if cfg.policy == "retriever" and not rc.generator:
        for start, spec in (cfg.reward_schedule or [[0, cfg.reward]]):
            names = [e["name"] for e in spec] if isinstance(spec, list) else list(spec)
            reading = sorted(set(names) & answer_rewards())
            if reading:
                raise ConfigError(f"reward {', '.join(reading)} (from step {start}) scores an answer, but "
                                  "retriever.generator is null: no answer is generated; set a generator or use "
                                  "gold_recall or answer_in_docs")
    if rc.hops > 1 and rc.generator:
        raise ConfigError("retriever.hops: with a generator, the generator decides when to search again; "
                          "set retriever.hops=1 or retriever.generator=null")
    branches = rc.history_branches
    if branches and (rc.hops == 1 or rc.generator):
        raise ConfigError("retriever.history_branches shares the draws of the hops before the last, so it needs "
                          "retriever.hops > 1 and retriever.generator=null; set it to 0")
    if branches and (branches < 2 or cfg.rollout.n % branches):
        raise ConfigError(f"retriever.history_branches={branches} must be 0 or a divisor of rollout.n={cfg.rollout.n} "
                          "of at least 2 (with 1, every trajectory of a group shares its earlier hops, and a group "
                          "estimator gives them no signal)")
    if cfg.policy == "retriever" and cfg.shard_params:
        raise ConfigError("shard_params: a retriever policy cannot be sharded with FSDP; set shard_params=false")


METHOD = register_method(Method(
    name="harr",
    paper="HARR (Reinforcement Fine-Tuning for History-Aware Dense Retriever in RAG)",
    trains="the query encoder of a dense retriever (Plackett–Luce draws); the generator stays frozen",
    setups={"retriever": retriever_setup},
    # Its section keeps the key it had before it was HARR's own, so recipes and runs read as before.
    settings=RetrieverSettings,
    settings_key="retriever",
    ranges=RANGES,
    writes_text=lambda settings: bool(settings.generator),
    check=check_harr_settings,
    preflight=preflight,
    plot_keys=("gold_recall", "eval/recall"),
    evaluation="retriever",
    eval_retriever=eval_retriever,
    recipes=("harr_grpo", "harr_ppo"),
))
