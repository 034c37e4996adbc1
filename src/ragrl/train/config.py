"""Typed training configuration. Recipes in `ragrl/recipes/*.yaml` fill these dataclasses.

Every run writes the fully resolved config to `<run_dir>/config.yaml`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Literal

from ragrl.algos.kl import KL_CONTROLLERS, KL_KINDS
from ragrl.algos.losses import AGG_MODES
from ragrl.algos.registry import ADVANTAGE_ESTIMATORS
from ragrl.methods.base import setups, sft_builders
from ragrl.policy.model_config import ModelConfig
from ragrl.rollout.multi_turn import RolloutConfig
from ragrl.rollout.protocol import PROTOCOLS, default_text_protocol
from ragrl.yaml_config import Choice

# Enumerations read from the registries when a recipe loads (one source of truth): the core's own
# entries and whatever the method records add.
Estimator = Annotated[str, Choice(lambda: list(ADVANTAGE_ESTIMATORS))]
LossAggregation = Annotated[str, Choice(lambda: list(AGG_MODES))]
KLKind = Annotated[str, Choice(lambda: list(KL_KINDS))]
KLController = Annotated[str, Choice(lambda: list(KL_CONTROLLERS))]
SFTBuilder = Annotated[str, Choice(lambda: ["gold_search", *sft_builders()])]   # gold_search: the core's
ProtocolName = Annotated[str, Choice(PROTOCOLS.names)]
PolicyKind = Annotated[str, Choice(lambda: ["lm", *setups()])]                  # lm: the core's


@dataclass
class DataConfig:
    train: str = "demo-train"             # question file (train split only)
    eval: str = "demo-eval"               # held-out questions for periodic evaluation
    index: str | None = None              # index dir or http:// URL; None: BM25 over `corpus`
    # What is indexed when `index` is null (None: the bundled demo corpus; `kit:…` a data-kit file),
    # and where SFT warm starts read gold passages (then it must be the index's corpus: checked).
    corpus: str | None = None
    # Precomputed passage vectors of `corpus` (.npy): with no `index`, a dense index over them is
    # built once and cached in $RAGRL_HOME (checked against the corpus and the encoder).
    vectors: str | None = None
    eval_n: int = 100


@dataclass
class AlgoConfig:
    estimator: Estimator = "grpo"
    clip_low: float = 0.2
    clip_high: float = 0.28
    dual_clip: float | None = None
    loss_agg: LossAggregation = "token_mean"
    kl_coef: float = 0.0
    kl_kind: KLKind = "k3"
    kl_in_reward: bool = False            # PPO style (reward) or GRPO style (loss)
    kl_target: float | None = None        # set for an adaptive coefficient
    kl_horizon: int = 10000
    kl_controller: KLController = "ziegler"   # how kl_target adapts the coefficient
    gamma: float = 1.0
    lam: float = 1.0
    entropy_coef: float = 0.0
    # The critic's loss (estimators with a critic, gae and gae_baseline, only: the others have
    # none, so setting these with them is refused rather than ignored). None: 0.5 and 0.2.
    value_coef: float | None = None
    value_clip: float | None = None
    ppo_epochs: int = 1
    minibatch_size: int = 8               # trajectories per optimizer step
    micro_batch_size: int = 4             # trajectories per forward/backward (gradient accumulation)

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
    steps: int = 0                        # 0: no warm start
    lr: float = 5e-4
    batch_size: int = 8
    max_len: int = 768
    # Share of warm-start episodes that answer without searching (questions drawn at random), so
    # that RL starts from a policy that does both and can learn *when* to search; 0: always search.
    direct_frac: float = 0.0
    # How episodes are built: gold search episodes (+ direct_frac), or SmartRAG's (answer directly
    # where the base model is right closed-book, else search and answer from the documents).
    builder: SFTBuilder = "gold_search"
    # SmartRAG builder: what counts as "already right" closed-book (ragrl.methods.smartrag.sft).
    known_if: Literal["em", "cover_em"] = "em"
    max_questions: int | None = None      # train questions used to build episodes (None: all)


@dataclass
class RetrieverConfig:
    """The retriever as the policy (HARR; `policy: retriever`). Defaults are HARR's GRPO settings."""

    encoder: str = "all-minilm-l6-v2"    # query encoder: the dense index's encoder, trained on the query side
    lora: bool = False                    # LoRA on the encoder (HARR), else full fine-tuning
    lora_r: int = 8
    lora_alpha: int = 16
    pool: int = 30                        # candidates from faiss per query (M)
    temperature: float = 0.05             # Plackett–Luce temperature (HARR: 0.05 GRPO, 0.02 PPO)
    history: bool = True                  # embed "Original Question / History / Query" for follow-up searches
    instruction: str = ""                 # prefix before the query text (for instruction-tuned encoders)
    # The frozen generator whose searches the retriever serves; null: one retrieval per question
    # with the question as the query and no generation (reward from the documents alone).
    generator: str | None = None
    generator_adapter: str | None = None  # e.g. a trained search agent's final_adapter
    generator_temperature: float = 0.0    # 0: greedy, so rewards vary with the documents only
    # Without a generator: searches per question. Each later hop embeds the question with the
    # history of what earlier hops found and draws `rollout.topk` passages not found yet;
    # evaluation then scores all hops' passages (k · hops).
    hops: int = 1
    # Without a generator, what a later hop's query carries of each passage earlier hops drew: its
    # title and first `history_words` words (where the next hop's entity is usually named).
    history_words: int = 8
    # Without a generator and with hops > 1: the hops before the last are drawn once per block of
    # rollout.n / history_branches trajectories of a group and shared by the block (a tree), so a
    # later hop embeds at most history_branches distinct histories per question instead of
    # rollout.n (each is re-encoded with gradients in the update). 0: every trajectory draws every hop.
    history_branches: int = 0
    # HARR's question filter: before training, keep only questions whose reward varies across a
    # group of samples from the starting encoder (the kept ids are saved; a resume reuses them).
    filter_questions: bool = True


@dataclass
class GuardConfig:
    """What the trainer does about the faults that end RL runs (ragrl.train.guards). A collapse rule
    is off at None; one set where it can never act (a KL ceiling with KL off) is refused on load."""

    # Consecutive steps whose every optimizer step was skipped for a non-finite loss or gradient
    # norm that count as a collapse (rule "nonfinite"). One non-finite update is always skipped,
    # said in the log and counted in the step's row.
    nonfinite_steps: int = 3
    entropy_floor: float | None = None        # sampled-action entropy (nats per action) under this
    kl_ceiling: float | None = None           # KL to the reference (needs algo.kl_coef > 0) over this
    format_error_ceiling: float | None = None   # format_error_rate over this (an LM policy only)
    reward_drop: float | None = None          # mean reward under its mean over the last `window` steps minus this
    window: int = 10                          # steps of the reward rule's recent level (none before)
    patience: int = 1                         # steps in a row a rule must hold before it trips
    max_rollbacks: int = 3                    # rollbacks before the run stops, naming the rule and the step
    # The remedy applied at each rollback, before training goes on from the restored checkpoint.
    remedy_lr_factor: float = 0.5             # the learning rate is multiplied by this
    remedy_skip_questions: bool = True        # the questions of the step that tripped leave the pool
    # A trajectory ended by rollout.max_episode_s / max_rollout_s: None scores it with the recipe's
    # reward like any unfinished episode (no answer); a number gives it that reward instead.
    timeout_reward: float | None = None
    # A retrieval server (data.index is a URL) that stops answering is waited for, with backoff and
    # jitter, this many seconds in all; then the run checkpoints its last completed step and exits
    # with code 75 (EX_TEMPFAIL), naming the URL. The in-process retriever never waits.
    retrieval_wait_s: float = 120.0


@dataclass
class TrainConfig:
    name: str = "run"
    # The text protocol the LM speaks (a registered name); default: the one for plain text (Search-R1's).
    agent: ProtocolName = field(default_factory=default_text_protocol)
    # What is trained: the LM that acts (lm), or the query encoder of the retriever it calls (retriever).
    policy: PolicyKind = "lm"
    out_dir: str = "runs/run"
    seed: int = 0
    steps: int = 20
    questions_per_step: int = 4           # times rollout.n trajectories per step
    lr: float = 2e-5
    lr_schedule: Literal["constant", "linear", "cosine"] = "constant"
    warmup_steps: int = 0
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    save_every: int = 5
    keep_last: int = 2
    # FSDP2 under several ranks (ragrl.policy.fsdp): each rank stores 1/world of every weight,
    # gradient and Adam moment. None: on under `accelerate launch --use_fsdp`, off otherwise.
    shard_params: bool | None = None
    # ZeRO-1 under several ranks, when parameters are not sharded: each rank keeps Adam's state
    # for its share of the parameters only; parameters and gradients stay replicated. None: on
    # under `accelerate launch --use_deepspeed`, off otherwise.
    shard_optimizer: bool | None = None
    # The first N steps train the critic (value head) only; the policy starts learning once its
    # advantages come from a critic that has seen rewards (verl's critic_warmup). A critic at its
    # zero start makes every advantage the raw reward, so agents whose rewards run higher (an
    # MMOA selector with selector_gold) reinforce whatever they sampled and the others the reverse.
    critic_warmup: int = 0
    eval_every: int = 0                   # 0: only at the end
    # Write the step's trajectories to run_dir/trajectories/step_N.jsonl every N steps (`ragrl view`).
    log_trajectories_every: int = 0
    # With eval_every: keep the policy that scored best on this metric of data.eval (a slice held
    # apart from the training questions) as run_dir/best_<adapter|encoder> (+ best.json): when to
    # stop is chosen on held-apart training questions, never on test questions.
    keep_best: str | None = None          # e.g. "recall" (retriever) or "f1" (agent)
    # Evaluate the starting policy on data.eval before the first step (`start/<metric>` in step 0's
    # row): the run's own baseline, decoded as every later evaluation is. With keep_best the start
    # is a candidate too (best.json step 0), so the kept policy is never below where it began there.
    eval_start: bool = False
    # > 0: evaluate, keep as best and export an exponential moving average of the trained weights
    # (avg = decay * avg + (1 - decay) * weights after every step); rollouts use the online weights.
    ema_decay: float = 0.0
    reward: dict = field(default_factory=lambda: {"f1": 1.0})
    reward_schedule: list = field(default_factory=list)  # [[from_step, spec], ...] overrides `reward`
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    rollout: RolloutConfig = field(default_factory=lambda: RolloutConfig(n=4, temperature=1.0))
    sft: SFTConfig = field(default_factory=SFTConfig)
    retriever: RetrieverConfig = field(default_factory=RetrieverConfig)
    # Agents whose trajectories are rolled out and scored but not trained on (MMOA-RAG ablations,
    # e.g. [rewriter, selector] trains only the generator). With one shared LoRA adapter this
    # removes their samples from the update; their prompts still share the adapter.
    frozen_agents: list[str] = field(default_factory=list)
    # shared: the agents share one LoRA adapter (the released MMOA-RAG code). per_agent: each agent
    # gets its own copy of it (ragrl.models.agent_adapters), so a frozen agent's adapter never changes.
    agent_adapters: Literal["shared", "per_agent"] = "shared"
    guard: GuardConfig = field(default_factory=GuardConfig)
    # Where the resolved config, every metric row and the final reports go besides metrics.jsonl (as
    # TRL's report_to): tensorboard (run_dir/tb), wandb (offline unless WANDB_MODE says otherwise),
    # mlflow (a local file store under run_dir/mlruns unless MLFLOW_TRACKING_URI is set). A tracker
    # asked for but not installed is refused at start, naming its extra (ragrl[wandb], ragrl[mlflow]).
    report_to: list[Literal["tensorboard", "wandb", "mlflow"]] = field(default_factory=lambda: ["tensorboard"])
