"""Typed training configuration. Recipes in `recipes/*.yaml` fill these dataclasses.

Every run writes the fully resolved config to `<run_dir>/config.yaml`.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ragrl.rollout.episode import RolloutConfig


@dataclass
class ModelConfig:
    name: str = "smollm2-135m-instruct"   # registry name, HF id or local path
    init_adapter: str | None = None       # a LoRA adapter (e.g. an SFT checkpoint) to start from
    lora: bool = True
    lora_r: int = 16
    lora_alpha: int = 32
    lora_dropout: float = 0.0             # dropout breaks "ratio == 1 at the first epoch"
    lora_targets: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj",
                                                             "gate_proj", "up_proj", "down_proj"])
    lora_layers: int | None = None        # LoRA on the top N decoder layers only (cheaper backward)
    engine: str = "hf"                    # hf | vllm | auto
    # Weights of the frozen base model. bfloat16 halves memory traffic and uses AMX/bf16 units
    # (2-3x faster on CPUs that have them); LoRA adapters, log-probs and values stay float32.
    dtype: str = "float32"                # float32 | bfloat16 | float16 | auto (bf16 where native)
    # Where the policy runs (and trains): auto = this rank's CUDA GPU when there is one, else CPU.
    device: str = "auto"                  # auto | cpu | cuda | cuda:N
    max_batch_size: int = 64              # generation rows at once


@dataclass
class DataConfig:
    train: str = "demo-train"             # question file (train split only)
    eval: str = "demo-eval"               # held-out questions for periodic evaluation
    index: str | None = None              # index dir or http:// URL; None: BM25 over `corpus`
    corpus: str | None = None             # None: the bundled demo corpus
    eval_n: int = 100
    shuffle: bool = True


@dataclass
class AlgoConfig:
    estimator: str = "grpo"               # gae | grpo | dr_grpo | rloo | reinforce_pp | reinforce_pp_baseline
    clip_low: float = 0.2
    clip_high: float = 0.28
    dual_clip: float | None = None
    loss_agg: str = "token_mean"          # token_mean | seq_mean_token_sum | seq_mean_token_mean
    kl_coef: float = 0.0
    kl_kind: str = "k3"                   # k1 | k2 | k3
    kl_in_reward: bool = False            # PPO style (reward) or GRPO style (loss)
    kl_target: float | None = None        # set for an adaptive coefficient
    kl_horizon: int = 10000
    gamma: float = 1.0
    lam: float = 1.0
    entropy_coef: float = 0.0
    value_coef: float = 0.5
    value_clip: float = 0.2
    ppo_epochs: int = 1
    minibatch_size: int = 8               # trajectories per optimizer step
    micro_batch_size: int = 4             # trajectories per forward/backward (gradient accumulation)


@dataclass
class SFTConfig:
    steps: int = 0                        # 0: no warm start
    lr: float = 5e-4
    batch_size: int = 8
    max_len: int = 768
    # Share of warm-start episodes that answer without searching (questions drawn at random), so
    # that RL starts from a policy that does both and can learn *when* to search; 0: always search.
    direct_frac: float = 0.0


@dataclass
class TrainConfig:
    name: str = "run"
    agent: str = "search_r1"
    out_dir: str = "runs/run"
    seed: int = 0
    steps: int = 20
    questions_per_step: int = 4           # times rollout.n trajectories per step
    lr: float = 2e-5
    lr_schedule: str = "constant"         # constant | linear | cosine
    warmup_steps: int = 0
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    save_every: int = 5
    keep_last: int = 2
    # FSDP2 under several ranks (ragrl.train.fsdp): each rank stores 1/world of every weight,
    # gradient and Adam moment. None: on under `accelerate launch --use_fsdp`, off otherwise.
    shard_params: bool | None = None
    # ZeRO-1 under several ranks, when parameters are not sharded: each rank keeps Adam's state
    # for its share of the parameters only; parameters and gradients stay replicated. None: on
    # under `accelerate launch --use_deepspeed`, off otherwise.
    shard_optimizer: bool | None = None
    eval_every: int = 0                   # 0: only at the end
    reward: dict = field(default_factory=lambda: {"f1": 1.0})
    reward_schedule: list = field(default_factory=list)  # [[from_step, spec], ...] overrides `reward`
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    rollout: RolloutConfig = field(default_factory=lambda: RolloutConfig(n=4, temperature=1.0))
    sft: SFTConfig = field(default_factory=SFTConfig)
