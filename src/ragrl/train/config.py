"""Typed training configuration. Recipes in `ragrl/recipes/*.yaml` fill these dataclasses.

Every run writes the fully resolved config to `<run_dir>/config.yaml`. Each field's help (its
`setting(help=...)`) is what `ragrl train RECIPE --explain [KEY]` prints and what the settings
tables of docs/recipes.md are generated from (scripts/settings_docs.py): write it for users.
"""
from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

from ragrl.algos.kl import KL_CONTROLLERS, KL_KINDS
from ragrl.algos.losses import AGG_MODES
from ragrl.algos.registry import ADVANTAGE_ESTIMATORS, POLICY_LOSSES
import ragrl.methods  # noqa: F401  (registers the methods, whose settings sections TrainConfig carries)
from ragrl.errors import ConfigError
from ragrl.methods.base import METHODS, POLICY_SETUPS, SFT_BUILDERS, Method
from ragrl.policy.model_config import ModelConfig
from ragrl.rollout.config import RolloutConfig
from ragrl.rollout.protocol import PROTOCOLS, default_text_protocol
from ragrl.yaml_config import Choice, load_config, move_key, setting

log = logging.getLogger("ragrl.config")

# Enumerations read from the registries when a recipe loads (one source of truth): the core's own
# entries and whatever the method records add.
Estimator = Annotated[str, Choice(lambda: list(ADVANTAGE_ESTIMATORS))]
PolicyLoss = Annotated[str, Choice(lambda: list(POLICY_LOSSES))]
LossAggregation = Annotated[str, Choice(lambda: list(AGG_MODES))]
KLKind = Annotated[str, Choice(lambda: list(KL_KINDS))]
KLController = Annotated[str, Choice(lambda: list(KL_CONTROLLERS))]
SFTBuilder = Annotated[str, Choice(SFT_BUILDERS.names)]
ProtocolName = Annotated[str, Choice(PROTOCOLS.names)]
PolicyKind = Annotated[str, Choice(POLICY_SETUPS.names)]


@dataclass
class DataConfig:
    """Where the questions and the passages come from."""

    train: str = setting("demo-train", help=(
        "Training questions: a bundled split (demo-train, pool-train, smartrag-train, multihop-train), "
        "`kit:<path>` for a file of the data kit, or a path to a JSON Lines (.gz), parquet or saved "
        "`datasets` file of id / question / answers rows. A training split only: never test questions."))
    eval: str = setting("demo-eval", help=(
        "Held-out questions for the periodic evaluations (eval_every, eval_start, keep_best), named as "
        "data.train is; keep it apart from the training questions."))
    index: str | None = setting(None, help=(
        "The index the policy searches: an index folder (`ragrl index`), `kit:<path>`, or an http:// "
        "URL of `ragrl serve` (several comma-separated: replicas of one index, taken in turn; one that "
        "goes away is skipped at once; parts joined by `|`: shards of one corpus, each searched and their "
        "top-k merged by score). null: built in process over data.corpus and cached (BM25; for a "
        "retriever policy a dense index over data.vectors)."))
    corpus: str | None = setting(None, help=(
        "The passages (JSON Lines) indexed when data.index is null, and where SFT warm starts read gold "
        "passages (then it must be the index's corpus: checked). null: the bundled demo corpus; "
        "`kit:<path>`: a data-kit file."))
    vectors: str | None = setting(None, help=(
        "Precomputed passage vectors of data.corpus (.npy): with no data.index, a dense index over them "
        "is built once and cached in $RAGRL_HOME (checked against the corpus and the encoder). null: none."))
    eval_n: int = setting(100, help="Questions of data.eval each evaluation uses (the file's first N).")


@dataclass
class AlgoConfig:
    """The RL update: advantage estimator, clipped policy loss, KL, critic and batching."""

    estimator: Estimator = setting("grpo", help=(
        "Advantage estimator. grpo: each sample's reward normalised within its question's group of "
        "rollout.n (dr_grpo: centred only, no std); rloo: leave-one-out baseline; reinforce_pp: "
        "REINFORCE++ (discounted token rewards, whitened over the batch; reinforce_pp_baseline: "
        "group-centred first); gae: PPO's GAE with a critic (value head); gae_baseline: GAE on group-centred rewards; "
        "enumerated: a group holding each candidate title once (rollout.title_group: every), each weighed by the "
        "policy's probability of it, the exact policy gradient of that choice. Group estimators need rollout.n >= 2."))
    policy_loss: PolicyLoss = setting("ppo_clip", help=(
        "The policy-gradient loss (ragrl.algos.registry.POLICY_LOSSES). ppo_clip: PPO's clipped "
        "surrogate with clip_low, clip_high and dual_clip (GRPO's too); a method may register its own."))
    clip_low: float = setting(0.2, help=(
        "PPO clip below: the probability ratio is clipped at 1 - clip_low."))
    clip_high: float = setting(0.28, help=(
        "PPO clip above: the ratio is clipped at 1 + clip_high (DAPO's clip-higher when above clip_low)."))
    dual_clip: float | None = setting(None, help=(
        "Dual-clip bound c > 1: where the advantage is negative, the loss is capped at -A * c. "
        "null: no dual clip."))
    loss_agg: LossAggregation = setting("token_mean", help=(
        "How per-token losses (policy, KL, entropy, value) reduce to one number. token_mean: over all "
        "action tokens (long responses weigh more; DAPO / Dr. GRPO); seq_mean_token_sum: mean over "
        "sequences of each one's token sum; seq_mean_token_mean: mean over sequences of each one's "
        "token mean (original GRPO)."))
    kl_coef: float = setting(0.0, help=(
        "Weight of the KL penalty to the reference policy (the starting policy: the base model, or "
        "the SFT / init adapter it starts from). 0: no KL and no reference forward pass."))
    kl_kind: KLKind = setting("k3", help=(
        "KL estimator per sampled token, with x = logp - ref_logp: k1 = x; abs = |x|; k2 = x^2 / 2; "
        "k3 = exp(-x) - 1 + x; low_var_kl = k3 with x and the result clamped (stable as a loss)."))
    kl_in_reward: bool = setting(False, help=(
        "true: the KL penalty is subtracted from the token rewards (PPO-RLHF style; token-level "
        "estimators only: gae, gae_baseline, reinforce_pp, reinforce_pp_baseline); false: it is a "
        "term of the loss (GRPO style)."))
    kl_target: float | None = setting(None, help=(
        "Target KL for an adaptive coefficient: kl_coef is then its starting value, raised when the "
        "measured KL is above the target and lowered below it (see kl_controller). null: kl_coef "
        "stays fixed."))
    kl_horizon: int = setting(10000, help=(
        "Ziegler controller only: samples over which the coefficient moves by at most 20% "
        "(value *= 1 + clip(KL / target - 1, -0.2, 0.2) * samples / horizon)."))
    kl_controller: KLController = setting("ziegler", help=(
        "How kl_target adapts the coefficient. ziegler: Ziegler et al. 2019, scaled by the samples "
        "of each update over kl_horizon; rl4lms: RL4LMs' (SmartRAG's), at most 2% per update."))
    gamma: float = setting(1.0, help=(
        "Discount between action tokens for the token-level estimators (gae, gae_baseline, "
        "reinforce_pp, reinforce_pp_baseline); observation tokens are skipped. 1: no discount."))
    lam: float = setting(1.0, help=(
        "GAE's lambda (gae, gae_baseline): 1 gives Monte-Carlo returns minus the value, 0 one-step "
        "TD errors."))
    entropy_coef: float = setting(0.0, help=(
        "Weight of an entropy bonus on the action tokens (subtracted from the loss). 0: off, and "
        "the entropy is not computed."))
    # The critic's loss (estimators with a critic, gae and gae_baseline, only: the others have
    # none, so setting these with them is refused rather than ignored).
    value_coef: float | None = setting(None, help=(
        "Weight of the critic's (value head's) loss; only for estimators with a critic (gae, "
        "gae_baseline): set with another it is refused. null: 0.5."))
    value_clip: float | None = setting(None, help=(
        "Clip range of the value loss (new values kept within this of the rollout's values); only "
        "for gae and gae_baseline. null: 0.2."))
    ppo_epochs: int = setting(1, help=(
        "Passes over each step's trajectories in the update (each pass reshuffles them into "
        "minibatches)."))
    minibatch_size: int = setting(8, help=(
        "Trajectories per optimizer step, counted over all ranks (a step's batch of "
        "questions_per_step * rollout.n gives batch / minibatch_size optimizer steps per epoch)."))
    micro_batch_size: int = setting(4, help=(
        "Trajectories per forward/backward pass (gradient accumulation up to minibatch_size): a "
        "memory knob that leaves the update unchanged."))
    reuse_frozen_trunk: bool = setting(True, help=(
        "Where an update runs each trajectory forward at least twice (a KL reference, a critic's old "
        "values, ppo_epochs > 1) and LoRA leaves the decoder's bottom layers without an adapter "
        "(model.lora_layers), run those layers once per trajectory and keep their output for every "
        "later forward: the same update (equal up to float rounding) for less compute, at the cost "
        "of holding batch x length x hidden values (float32 on a CPU: 128 episodes of 600 tokens "
        "with SmolLM2's 576 hidden units, 177 MB). false: every forward runs the whole decoder."))

    drop_flat_groups: bool = setting(False, help=(
        "Leave out of the update every question whose group's rewards are all equal: under an "
        "estimator that reads only its group's scores (grpo, dr_grpo, rloo, enumerated) their advantage is 0, so "
        "they would add only the KL term and the update's cost (DAPO's dynamic-sampling filter, "
        "without drawing more questions). A step whose groups are all flat takes no gradient step. "
        "One rank only."))

    @property
    def has_critic(self) -> bool:
        """Whether the estimator reads a value head's values (and so trains one)."""
        return "values" in ADVANTAGE_ESTIMATORS[self.estimator].needs

    @property
    def critic(self) -> tuple[float, float]:
        """(value_coef, value_clip) with the defaults filled in."""
        return (0.5 if self.value_coef is None else self.value_coef,
                0.2 if self.value_clip is None else self.value_clip)


@dataclass
class SFTConfig:
    """The supervised warm start that fits a LoRA adapter before RL (on synthesised episodes)."""

    steps: int = setting(0, help=(
        "Optimizer steps of the SFT warm start before RL (its adapter is then RL's start and KL "
        "reference). 0: no warm start."))
    lr: float = setting(5e-4, help="Learning rate of the warm start (AdamW, decaying linearly to 0).")
    batch_size: int = setting(8, help="Episodes per SFT optimizer step.")
    max_len: int = setting(768, help=(
        "Longest SFT episode in tokens (prompt included); longer episodes are left out."))
    # Share of direct episodes: RL then starts from a policy that does both and can learn *when* to search.
    direct_frac: float = setting(0.0, help=(
        "gold_search builder: share of warm-start episodes that answer without searching (questions "
        "drawn at random), so RL starts from a policy that takes both actions. 0: always search."))
    builder: SFTBuilder = setting("gold_search", help=(
        "How episodes are built. gold_search: gold passages put into real search results, episodes "
        "whose answer the observations show (+ direct_frac), searching the question, then each further "
        "gold title; gold_search_missed: the same, but a further search names only a gold title the "
        "searches so far missed and the episode can read (question or observations), else it "
        "answers (one query a search); missed_after_question: the episode rollout.first_action=question "
        "with second_action=search makes (the runner's search of the question and the second search's "
        "opening masked, one query naming a gold title those passages name but do not show, the answer), "
        "questions without such a title left out; smartrag: answer directly where the "
        "base model is already right closed-book, else search and answer from the documents; mmoa: "
        "MMOA-RAG's episodes for each of its agents."))
    max_questions: int | None = setting(None, help=(
        "smartrag and mmoa builders: training questions drawn (seeded) to build episodes from. "
        "null: all."))


@dataclass
class GuardConfig:
    """What the trainer does about the faults that end RL runs (ragrl.train.guards). A collapse rule
    is off at None; one set where it can never act (a KL ceiling with KL off) is refused on load."""

    nonfinite_steps: int = setting(3, help=(
        "Consecutive steps whose every optimizer step was skipped for a non-finite loss or gradient "
        "norm that count as a collapse (rule nonfinite). One non-finite update is always skipped, "
        "said in the log and counted in the step's row."))
    entropy_floor: float | None = setting(None, help=(
        "Collapse rule: sampled-action entropy (nats per action) under this. null: off."))
    kl_ceiling: float | None = setting(None, help=(
        "Collapse rule: KL to the reference over this (needs algo.kl_coef > 0). null: off."))
    format_error_ceiling: float | None = setting(None, help=(
        "Collapse rule: the step's format-error rate over this (a policy that writes text). null: off."))
    reward_drop: float | None = setting(None, help=(
        "Collapse rule: mean reward under its mean over the last guard.window steps minus this. "
        "null: off."))
    window: int = setting(10, help=(
        "Steps whose mean reward is the reward_drop rule's recent level (the rule waits for them)."))
    patience: int = setting(1, help="Steps in a row a collapse rule must hold before it trips.")
    max_rollbacks: int = setting(3, help=(
        "Rollbacks to the newest intact checkpoint before the run stops (exit code 3), naming the "
        "rule and the step."))
    remedy_lr_factor: float = setting(0.5, help=(
        "At each rollback the learning rate is multiplied by this, before training goes on from "
        "the restored checkpoint."))
    remedy_skip_questions: bool = setting(True, help=(
        "At each rollback, the questions of the step that tripped leave the pool."))
    timeout_reward: float | None = setting(None, help=(
        "Reward of a trajectory ended by rollout.max_episode_s or max_rollout_s. null: scored with "
        "the recipe's reward like any unfinished episode (no answer)."))
    retrieval_wait_s: float = setting(120.0, help=(
        "Seconds in all a retrieval server (data.index is a URL) that stops answering is waited for, "
        "with backoff and jitter; then the run checkpoints its last completed step and exits with "
        "code 75, naming the URL. The in-process retriever never waits."))
    rank_silence_s: float = setting(60.0, help=(
        "Under several ranks: seconds without a heartbeat from another rank (a thread in each writes "
        "one to the process group's store ten times in this span) after which it counts as killed or "
        "frozen; every other rank then exits with code 69, naming it and its last step."))
    collective_timeout_s: float = setting(1800.0, help=(
        "Under several ranks: the process group's timeout. A rank whose heartbeat goes on but that does "
        "not reach a collective in this time (a hung rollout) makes the others exit with code 69, "
        "naming it. It must cover the longest wait between ranks: a rollout, rank 0's evaluation."))


@dataclass
class CoreConfig:
    """A training run's core settings: what is trained, on what, how, and where it is written
    (TrainConfig adds each method's own section)."""

    name: str = setting("run", help="Run name, given to the experiment trackers (report_to).")
    agent: ProtocolName = setting(factory=default_text_protocol, help=(
        "The text protocol the LM speaks (a registered name): its prompt, action tags and parser. "
        "Default: the plain-text one (Search-R1's)."))
    policy: PolicyKind = setting("lm", help=(
        "What is trained: the LM that acts (lm), or the query encoder of the retriever it calls "
        "(retriever; see the retriever section)."))
    out_dir: str = setting("runs/run", help=(
        "Run directory: config.yaml, metrics.jsonl, checkpoints/, the final adapter or encoder, "
        "train.log and the trackers' files. --resume continues from it."))
    seed: int = setting(0, help=(
        "Seed of the run: weight init, the order of questions, every rollout's sampling (per step "
        "and rank), minibatch shuffles and the warm start."))
    steps: int = setting(20, help="RL steps (each: rollouts of questions_per_step questions, then the update).")
    questions_per_step: int = setting(4, help=(
        "Questions per RL step over all ranks (a multiple of the number of ranks), each sampled "
        "rollout.n times."))
    experts_per_group: int = setting(0, help=(
        "Expert episodes added to each question's group (DAVID-GRPO's expert bootstrapping): they "
        "search the question, then the further gold passages' titles, read the index's own results "
        "and answer with the gold answer (or, under rollout.end_after_searches, end on the last "
        "search's passages, as the runner's episodes do); scored by the reward like any sample, "
        "with the current policy's log-probs as their old ones. A question whose expert is shown no gold answer gets "
        "none. Needs gold_passage_ids in data.train, a multi-turn search protocol and a group "
        "estimator (grpo, rloo, ...). 0: none."))
    experts_query: Literal["every_gold", "missed_gold"] = setting("every_gold", help=(
        "What an expert episode searches after the question. every_gold: each further gold title in "
        "turn; missed_gold: only a gold title its searches so far have not shown and that its question "
        "or observations name (one query a search), as sft.builder=missed_after_question teaches. "
        "Experts take the runner's shape (rollout.first_action, second_action, end_after_searches)."))
    lr: float = setting(2e-5, help="AdamW's learning rate for the RL updates (peak, after warm-up).")
    lr_schedule: Literal["constant", "linear", "cosine"] = setting("constant", help=(
        "Learning rate after warm-up: constant, or decaying to 0 at the last step, linearly or "
        "along a cosine."))
    warmup_steps: int = setting(0, help=(
        "Steps of linear learning-rate warm-up (lr * (step + 1) / warmup_steps). 0: none."))
    weight_decay: float = setting(0.0, help="AdamW's decoupled weight decay.")
    max_grad_norm: float = setting(1.0, help=(
        "Gradients are clipped to this global norm before each optimizer step."))
    save_every: int = setting(5, help="Checkpoint every N steps (and at the last step).")
    keep_last: int = setting(2, help="Intact checkpoints kept; older ones are deleted.")
    shard_params: bool | None = setting(None, help=(
        "FSDP2 under several ranks: each rank stores 1/world of every weight, gradient and Adam "
        "moment. null: on under `accelerate launch --use_fsdp`, off otherwise."))
    shard_optimizer: bool | None = setting(None, help=(
        "ZeRO-1 under several ranks, when parameters are not sharded: each rank keeps Adam's state "
        "for its share of the parameters; parameters and gradients stay replicated. null: on under "
        "`accelerate launch --use_deepspeed`, off otherwise."))
    # A critic at its zero start makes every advantage the raw reward, so agents whose rewards run
    # higher (an MMOA selector with selector_gold) reinforce whatever they sampled and the others the reverse.
    critic_warmup: int = setting(0, help=(
        "The first N steps train the critic (value head) only; the policy starts learning once its "
        "advantages come from a critic that has seen rewards (verl's critic_warmup). Estimators "
        "with a critic only; 0: none."))
    eval_every: int = setting(0, help=(
        "Evaluate greedily on data.eval (its first data.eval_n questions) every N steps, logged as "
        "eval/<metric>. 0: no evaluation during training (`ragrl eval --run RUN` evaluates a run after)."))
    log_trajectories_every: int = setting(0, help=(
        "Write the step's trajectories to run_dir/trajectories/step_N.jsonl every N steps (for "
        "`ragrl view`). 0: never."))
    # When to stop is chosen on held-apart training questions, never on test questions.
    keep_best: str | None = setting(None, help=(
        "With eval_every: keep the policy that scored best on this metric of data.eval (e.g. recall "
        "for a retriever, f1 for an agent) as run_dir/best_<adapter|encoder> (+ best.json). "
        "null: keep only the final policy."))
    eval_start: bool = setting(False, help=(
        "With eval_every: evaluate the starting policy on data.eval before the first step "
        "(start/<metric> in step 0's row), the run's own baseline; with keep_best the start is a "
        "candidate too, so the kept policy is never below where it began."))
    ema_decay: float = setting(0.0, help=(
        "> 0: evaluate, keep as best and export an exponential moving average of the trained weights "
        "(avg = decay * avg + (1 - decay) * weights after every step); rollouts use the online "
        "weights. 0: off."))
    reward: dict = setting(factory=lambda: {"f1": 1.0}, whole=True, help=(
        "The reward: registered reward names mapped to a weight, or to {weight: W, <option>: ...} "
        "(e.g. {f1: 1.0, format: 0.2}); the weighted sum scores each trajectory. A child recipe's "
        "reward replaces its base's whole (in its variants too); a variant's, and --set "
        "reward.NAME=W, merge into the recipe's."))
    reward_schedule: list = setting(factory=list, whole=True, help=(
        "[[from_step, spec], ...], the first from step 0: from each step on, that reward spec "
        "replaces `reward` (a curriculum). Empty: `reward` throughout."))
    model: ModelConfig = setting(factory=ModelConfig, help=(
        "The LM: which model, its LoRA adapter, dtype and device, and the rollout engine."))
    data: DataConfig = setting(factory=DataConfig, help="Where the questions and the passages come from.")
    algo: AlgoConfig = setting(factory=AlgoConfig, help=(
        "The RL update: advantage estimator, clipped policy loss, KL, critic and batching."))
    rollout: RolloutConfig = setting(factory=lambda: RolloutConfig(n=4, temperature=1.0), help=(
        "Episodes: turn and token budgets, retrieval depth, sampling and wall-time bounds."))
    sft: SFTConfig = setting(factory=SFTConfig, help=(
        "The supervised warm start that fits a LoRA adapter before RL."))
    frozen_agents: list[str] = setting(factory=list, help=(
        "Agents (of a multi-agent protocol: MMOA-RAG's rewriter, selector, generator) whose "
        "trajectories are rolled out and scored but not trained on, e.g. [rewriter, selector] to "
        "train the generator only. With a shared adapter their prompts still share it."))
    agent_adapters: Literal["shared", "per_agent"] = setting("shared", help=(
        "shared: the agents share one LoRA adapter (the released MMOA-RAG code); per_agent: each "
        "agent gets its own copy of it, so a frozen agent's adapter never changes (hf engine)."))
    guard: GuardConfig = setting(factory=GuardConfig, help=(
        "What the trainer does about non-finite updates, collapses, stuck episodes and a retrieval "
        "server that goes away."))
    report_to: list[Literal["tensorboard", "wandb", "mlflow"]] = setting(factory=lambda: ["tensorboard"], help=(
        "Trackers that get the resolved config, every metric row and the final reports besides "
        "metrics.jsonl: tensorboard (run_dir/tb), wandb (offline unless WANDB_MODE says otherwise), "
        "mlflow (a file store in run_dir/mlruns unless MLFLOW_TRACKING_URI is set). One not installed "
        "is refused at start, naming its extra. []: none."))


def _with_sections(base: type, methods: list[Method]) -> type:
    """`base` with one field per method that has settings: its section, under its key."""
    core = {f.name for f in dataclasses.fields(base)}
    clash = [m.section for m in methods if m.section in core]
    if clash:
        raise ConfigError(f"method settings section {clash[0]!r} has the name of a core setting")
    cls = dataclasses.make_dataclass("TrainConfig", [
        (m.section, m.settings, setting(factory=m.settings, help=(
            f"{m.paper}: the method's own settings (read by its runs only; another method's run "
            "refuses them set).")))
        for m in methods], bases=(base,))
    cls.__module__ = __name__   # pickled and found by name like any module-level class
    cls.__doc__ = ("A training run: the core's settings (CoreConfig) and each method's own section "
                   "(ragrl.methods.base.Method.settings).")
    return cls


TrainConfig = _with_sections(CoreConfig, [m for m in METHODS.values() if m.section])
_LATER: dict[tuple, type] = {}


def train_config_class() -> type:
    """TrainConfig with the sections of every method registered now: TrainConfig itself, or, when a
    method was registered after this module loaded (one defined in a test or a user's script), an
    extension of it with that method's section."""
    have = {f.name for f in dataclasses.fields(TrainConfig)}
    later = [m for m in METHODS.values() if m.section and m.section not in have]
    if not later:
        return TrainConfig
    key = tuple((m.section, m.settings) for m in later)
    if key not in _LATER:
        _LATER[key] = _with_sections(TrainConfig, later)
    return _LATER[key]


_ANNOUNCED: set[str] = set()


def migrate_moved_keys(data: dict) -> dict:
    """A merged recipe or run config with each method's moved keys (`Method.moved_keys`) under their
    new names: old recipes and old runs' config.yaml still load. An old key set away from its default
    is announced once a process as deprecated (a run's config.yaml written before the move holds every
    key at its default: that is said in the log only, not on the console)."""
    for method in METHODS.values():
        for old, new in method.moved_keys.items():
            if not move_key(data, old, f"{method.section}.{new}") or old in _ANNOUNCED:
                continue
            value = data[method.section][new]
            value = getattr(value, "value", value)   # a --set override keeps its text beside its value
            default = getattr(method.settings(), new)
            if value == default or (isinstance(default, list) and value in ([], ())):
                log.debug("config key '%s' (at its default) is read as '%s.%s'", old, method.section, new)
                continue
            _ANNOUNCED.add(old)
            log.warning("config key '%s' is deprecated: it is now '%s.%s' (%s's own settings); the old key is "
                        "read as the new one for now", old, method.section, new, method.name)
    return data


def load_train_file(path: str | Path | None, overrides: list[str] | None = None,
                    variant: str | None = None) -> TrainConfig:
    """A recipe (with its base chain, variant and overrides) or a run's config.yaml as a TrainConfig
    with every registered method's section, old keys migrated."""
    return load_config(train_config_class(), path, overrides, variant=variant, migrate=migrate_moved_keys)
