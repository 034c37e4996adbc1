"""The RL trainer: draw questions, roll out, reward, compute advantages, update, checkpoint.

    trainer = Trainer(cfg); trainer.train(resume=False)

One step (the same under `accelerate launch`, where each rank takes its slice of the step's
questions and gradients are summed across ranks in `update.py`), in named phases:
  1. `_step_samples`: a seeded permutation that depends only on (seed, step) (train/steps.py),
     so resuming needs nothing but the step number to continue the data order exactly;
  2. `_roll_out`: the setup's rollout (train/setup.py) samples `rollout.n` trajectories per question:
     an LM policy rolls out with itself (no weight sync on one CPU/GPU); a retriever policy serves
     the searches of a frozen generator (or of the question itself) with Plackett–Luce draws;
  3. `_score`: the recipe's reward (by name, possibly scheduled by step) scores each trajectory
     and any expert episodes (`experts_per_group`) in `scoring.score_step`;
  4. `_update`: `update.update_on` (collate, `prepare`, `ppo_update`) turns them into gradient
     steps for any Policy; then the scheduler, the weight average and the KL controller;
  5. metrics go to metrics.jsonl and `report_to` (TensorBoard, wandb, MLflow); checkpoints atomic, `latest` last.
"""
from __future__ import annotations

import contextlib
import json
import logging
import time
from dataclasses import asdict, replace
from pathlib import Path

from ragrl.algos.kl import make_kl_controller
from ragrl.datasets import load_questions
from ragrl.errors import ConfigError, RetrievalOutage, TrainingCollapsed
from ragrl.eval.report import write_trajectories
from ragrl.methods.base import method_for
from ragrl.policy.fsdp import (
    full_optimizer_state,
    full_params,
    full_state_dict,
    shard_params,
)
from ragrl.retrieval.client import RetrievalUnavailable
from ragrl.rewards.registry import make_reward
from ragrl.rewards.schedule import RewardSchedule
from ragrl.train.averaging import WeightAverage
from ragrl.train.check import check_combinations
from ragrl.train.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from ragrl.train.config import TrainConfig
from ragrl.train.distributed import (
    barrier,
    check_divisible,
    init_distributed,
    make_optimizer,
    optimizer_state_bytes,
    reduce_metrics,
    wants_sharded_optimizer,
    wants_sharded_params,
)
from ragrl.train.experts import ExpertSource, take_policy_logprobs
from ragrl.train.guards import CollapseWatch, Trip, scale_learning_rate
from ragrl.train.progress import TrainProgress
from ragrl.train.rank_watch import RankWatch, is_collective_failure
from ragrl.train.rng import get_rng_state, seed_everything, set_rng_state
from ragrl.train.run_dir import (
    MetricsLogger,
    clear_time_bound_cut,
    plot_curves,
    prepare_run_dir,
    record_time_bound_cut,
    setup_file_logging,
    write_resolved_config,
)
from ragrl.train.scoring import score_step
from ragrl.train.setup import build_setup
from ragrl.train.step_metrics import timing_metrics, trajectory_metrics
from ragrl.train.steps import make_scheduler, step_questions
from ragrl.train.update import update_on

log = logging.getLogger("ragrl.train")


class Trainer:
    """RL training of one recipe's policy: `train()` runs (or resumes) its steps; `train_step()` is one."""

    def __init__(self, cfg: TrainConfig, *, retriever=None, model_bundle=None):
        check_combinations(cfg)   # before any model, index or rollout
        self.cfg = cfg
        # joins torchrun/accelerate's group, else (0, 1); from here on a rank lost is named, not waited for
        self.rank, self.world = init_distributed(cfg.guard.collective_timeout_s)
        self.ranks = RankWatch(self.rank, self.world, cfg.guard.rank_silence_s) if self.world > 1 else None
        check_divisible(cfg.questions_per_step, self.world)
        if cfg.algo.drop_flat_groups and self.world > 1:
            # Ranks would keep different numbers of trajectories, so their gradient steps (and the
            # collectives inside them) would no longer pair up.
            raise ConfigError(f"algo.drop_flat_groups runs on one rank; this run has {self.world}")
        # The same seed on every rank: LoRA / value-head init must be identical across ranks.
        seed_everything(cfg.seed)
        self.setup = build_setup(cfg, retriever=retriever, model_bundle=model_bundle)
        self.policy = self.setup.policy
        self.model = self.policy.module
        self.experts = ExpertSource(cfg, self.setup.extras) if cfg.experts_per_group else None
        # FSDP2 swaps each weight for its shard in place, so it comes before the optimizer is
        # built; the engine keeps the same module (rollouts run inside `full_params`).
        self.params_sharded = wants_sharded_params(cfg.shard_params, self.world)
        if self.params_sharded:
            if not self.setup.shardable:
                raise ConfigError(f"shard_params: a {cfg.policy} policy cannot be sharded with FSDP; "
                                  "set shard_params=false (its weights are small)")
            if cfg.agent_adapters == "per_agent":
                raise ConfigError("agent_adapters=per_agent: FSDP sharding with several adapters is untested; "
                                  "set shard_params=false (the adapters are small) or agent_adapters=shared")
            shard_params(self.model)
        self.questions = load_questions(cfg.data.train)
        params = [p for p in self.model.parameters() if p.requires_grad]
        extra = [p for m in (self.policy.extra_modules() or {}).values() for p in m.parameters()]
        self.sharded = wants_sharded_optimizer(cfg.shard_optimizer, self.world, self.params_sharded)
        self.optimizer = make_optimizer([{"params": params}, {"params": extra}], lr=cfg.lr,
                                        weight_decay=cfg.weight_decay, shard=self.sharded)
        if self.sharded:
            log.info("optimizer state sharded over %d ranks (ZeRO-1)", self.world)
        self.scheduler = make_scheduler(self.optimizer, cfg)
        self.ema = None
        if cfg.ema_decay:
            if self.params_sharded:
                raise ConfigError("ema_decay: weight averaging of FSDP-sharded parameters is not supported; "
                                  "set ema_decay=0 or shard_params=false")
            self.ema = WeightAverage(self.model, cfg.ema_decay)
        self.kl = make_kl_controller(cfg.algo.kl_coef, cfg.algo.kl_target, cfg.algo.kl_horizon,
                                     cfg.algo.kl_controller)
        schedule = cfg.reward_schedule or [[0, cfg.reward]]
        self.rewards = RewardSchedule([(int(s), spec) for s, spec in schedule])
        self.run_dir = Path(cfg.out_dir)
        self.step = 0
        self.watch = CollapseWatch(cfg.guard)
        self.cut_by_time_bound: int | None = None   # the step a time budget stopped train() at, if it did

    # ---------------------------------------------------------------- public
    def train(self, *, resume: bool = False, progress=True, time_budget_s: float | None = None) -> list[dict]:
        """Run (or continue) training to cfg.steps, or fewer: with `time_budget_s` (this call's wall
        time, the question filter and the start's evaluation included), no step starts that would
        (at the mean step time so far) end past the budget. Return this call's rows."""
        cfg = self.cfg
        t_call = time.perf_counter()
        prepare_run_dir(self.run_dir, resume=resume)
        # Every rank checks the folder before any rank writes to it: a rank that came late would see
        # rank 0's first checkpoint and refuse the run as "already has checkpoints" (exit 2).
        barrier()
        if self.rank == 0:
            write_resolved_config(self.run_dir, asdict(cfg))
        setup_file_logging(self.run_dir, rank=self.rank)
        # Only rank 0 owns metrics.jsonl: a second writer (or a second truncate_after) would race it.
        logger = MetricsLogger(self.run_dir, report_to=cfg.report_to, config=asdict(cfg), run_name=cfg.name,
                               resume=resume) if self.rank == 0 else None
        pending = None   # a step whose update was done when the retrieval server went away in its evaluation
        if resume and (ck := latest_checkpoint(self.run_dir)) is not None:
            pending = self._load(ck).get("pending_row")
            if logger is not None:
                logger.truncate_after(self.step - 1 - (pending is not None))
            log.info("resumed from %s at step %d", ck.name, self.step)
        rows = []
        bar = TrainProgress(progress and self.rank == 0, cfg.steps, self.step, time_budget_s)
        try:
            with self._outage_checkpoint():
                if self.setup.select_questions is not None:   # e.g. HARR's filter, before any step
                    self.policy.eval()
                    self.questions = self.setup.select_questions(self.questions, make_reward(self.rewards.at(0)),
                                                                 self.run_dir, self.rank == 0)
                self._leave_out_skipped()
                start = None   # the start's metrics, logged in step 0's row
                if cfg.eval_start and self.step == 0:
                    start = self.evaluate()
                    if cfg.keep_best:
                        self._keep_best({f"eval/{k}": v for k, v in start.items()}, after=0)
                if pending is not None:
                    self._finish_step(pending, logger, rows, bar, self.step - 1)
                if self.step == 0 and latest_checkpoint(self.run_dir) is None:
                    self._save()   # the start: where a collapse before the first save rolls back to
            t_begin = time.perf_counter()
            before_steps = t_begin - t_call   # the filter and the start's evaluation spent the budget too
            event: dict = {}   # a rollback's record, logged in the next step's row
            while self.step < cfg.steps:
                elapsed = time.perf_counter() - t_begin
                if (time_budget_s is not None and rows
                        and before_steps + elapsed * (len(rows) + 1) / len(rows) > time_budget_s):
                    # A safety, not a schedule: a cut run differs from the recipe's fixed steps (the same
                    # seed on a faster machine trains further), so it says so where a person looks.
                    self.cut_by_time_bound = self.step
                    log.warning("THE WALL-TIME BOUND CUT THIS RUN: %.0f s reached after %d of %d steps. Its "
                                "figures are not the recipe's fixed-step result; the same seed on another "
                                "machine trains further. `--resume` continues it to step %d.",
                                time_budget_s, self.step, cfg.steps, cfg.steps)
                    if self.rank == 0:
                        record_time_bound_cut(self.run_dir, self.step, cfg.steps, time_budget_s)
                    with self._outage_checkpoint():
                        if cfg.keep_best and self.step % cfg.eval_every:   # the last step was not evaluated
                            self._evaluate_at_stop(rows[-1], logger)
                    self._save()
                    break
                with self._outage_checkpoint():
                    row = self.train_step()
                row.update(event)
                event = {}
                if (trip := self.watch.observe(self.step, row)) is not None:
                    event = self._roll_back(trip, row, logger)
                    continue
                if start is not None:
                    row.update({f"start/{k}": v for k, v in start.items()})
                    start = None
                self._finish_step(row, logger, rows, bar, self.step)
            if self.rank == 0 and self.cut_by_time_bound is None:   # e.g. a resumed run that reached its steps
                clear_time_bound_cut(self.run_dir)
            # Under FSDP the final adapter is gathered by every rank; rank 0 writes it (and sends its
            # files to the trackers, which close below).
            final_state = full_state_dict(self.model) if self.params_sharded else None
            if self.rank == 0:
                self._finish(final_state, logger)
        except BaseException as e:
            if logger is not None:
                logger.close(failed=True)   # wandb and MLflow mark the run failed
            if self.ranks is not None:
                if is_collective_failure(e):   # gloo's or NCCL's error names no rank
                    raise self.ranks.explain(e) from e
                self.ranks.stop(error=e)          # the others name this rank and its error at once
            raise
        finally:
            bar.close()
            if logger is not None:
                logger.close()
        if self.ranks is not None:
            self.ranks.stop()   # a rank done with its loop may wait long in the final barrier
        return rows

    def _finish_step(self, row: dict, logger, rows: list, bar, step: int) -> None:
        """Evaluate (when due), log and checkpoint step `step`, whose update is done. A retrieval
        server that goes away in the evaluation leaves a checkpoint after the update with this row
        pending: the resumed run evaluates it first, so its metrics equal an uninterrupted run's."""
        cfg = self.cfg
        self.step = step + 1
        if cfg.eval_every and self.step % cfg.eval_every == 0:
            with self._outage_checkpoint(pending_row=row):
                row.update({f"eval/{k}": v for k, v in self.evaluate().items()})
            if cfg.keep_best:
                self._keep_best(row, after=self.step)
        if logger is not None:
            logger.log(step, row)
        rows.append(row)
        if self.step % cfg.save_every == 0 or self.step == cfg.steps:
            self._save()
        bar.update(row)

    @contextlib.contextmanager
    def _outage_checkpoint(self, pending_row: dict | None = None):
        """A retrieval server gone for good (RetrievalUnavailable, after guard.retrieval_wait_s):
        nothing is finished half-way. The step in progress is dropped (its RNG draws undone), the
        last completed step is checkpointed, and the run stops with RetrievalOutage (exit 75);
        `--resume` continues exactly once the server is back."""
        rng = get_rng_state()
        try:
            yield
        except RetrievalUnavailable as e:
            if pending_row is None:
                set_rng_state(rng)
            if self.step > 0 or pending_row is not None:
                self._save(pending_row=pending_row)
            where = f"step {self.step}" if self.step else "the start (nothing trained yet)"
            raise RetrievalOutage(f"{e}; the run stopped with a checkpoint at {where}: start the server again and "
                                  f"run the same command with --resume ({self.run_dir})") from e

    def _roll_back(self, trip: Trip, row: dict, logger) -> dict:
        """A collapse rule tripped: log the step that tripped, restore the newest intact checkpoint,
        apply the remedy, and return the event to log in the next row. Raise TrainingCollapsed
        after guard.max_rollbacks rollbacks."""
        g = self.cfg.guard
        row.update({"guard/trip": 1.0, f"guard/trip/{trip.rule}": trip.value})
        if logger is not None:
            logger.log(self.step, row)
        ck = latest_checkpoint(self.run_dir)
        if self.watch.rollbacks >= g.max_rollbacks:
            raise TrainingCollapsed(f"{trip.describe()}, after {self.watch.rollbacks} rollbacks "
                                    f"(guard.max_rollbacks={g.max_rollbacks}): the run stops; its last good "
                                    f"checkpoint is {ck}")
        ids = [str(self.questions[i].get("id", i)) for i in
               step_questions(len(self.questions), self.step, self.cfg.questions_per_step, self.cfg.seed)]
        self.watch.record_rollback(trip, ids)
        self._load(ck, rollback=True)
        self._leave_out_skipped()
        log.warning("%s: rolled back to %s (rollback %d of %d; learning rate x%g%s)", trip.describe(), ck.name,
                    self.watch.rollbacks, g.max_rollbacks, self.watch.lr_scale,
                    f"; {len(ids)} questions left out" if g.remedy_skip_questions else "")
        if logger is not None:   # the discarded steps stay on record in rolled_back.jsonl
            logger.truncate_after(self.step - 1, archive="rolled_back.jsonl")
        return {"guard/rollback": 1.0, "guard/tripped_step": float(trip.step), f"guard/trip/{trip.rule}": trip.value}

    def _leave_out_skipped(self) -> None:
        """The remedy's questions (guard.remedy_skip_questions) leave the training pool."""
        if self.watch.skipped_ids:
            gone = set(self.watch.skipped_ids)
            self.questions = [q for i, q in enumerate(self.questions) if str(q.get("id", i)) not in gone]
            if len(self.questions) < self.cfg.questions_per_step:
                raise TrainingCollapsed(f"guard.remedy_skip_questions left {len(self.questions)} training questions, "
                                        f"fewer than questions_per_step ({self.cfg.questions_per_step})")

    def _evaluate_at_stop(self, last: dict, logger) -> None:
        """The time budget ended between evaluations (eval_every): evaluate the policy as it stands,
        so `keep_best` weighs the steps since the last evaluation too, and a run stopped before its
        first evaluation still keeps a policy."""
        first = not (self.run_dir / "best.json").exists()
        log.log(logging.WARNING if first else logging.INFO,
                "the time budget ended after %d steps, %s (eval_every=%d): evaluating the policy of step %d on %s",
                self.step, "before the first evaluation" if first else "between evaluations", self.cfg.eval_every,
                self.step, self.cfg.data.eval)
        row = {f"eval/{k}": v for k, v in self.evaluate().items()}
        last.update(row)
        self._keep_best(row, after=self.step)
        if logger is not None:
            logger.log(self.step - 1, {**row, "eval/at_time_budget": 1.0})

    def _finish(self, state: dict | None = None, logger=None) -> None:
        """The policy's final artifact (adapter or encoder, for chained stages), curve plots, trackers' files."""
        with self._averaged():
            self.setup.export(self.run_dir / f"final_{self.setup.artifact}", state)
        method = method_for(self.cfg.agent, self.cfg.policy)
        plot_curves(self.run_dir, method.plot_keys if method else ())
        for path in (self.run_dir / "config.yaml", self.run_dir / "curves.png"):
            if logger is not None and path.exists():
                logger.log_file(path)

    def _keep_best(self, row: dict, after: int | None = None) -> None:
        """Export the policy when `keep_best` improved on the held-apart eval questions (`after`:
        the steps taken, 0 for the start; a tie keeps the earlier policy)."""
        after = self.step + 1 if after is None else after
        key = f"eval/{self.cfg.keep_best}"
        if key not in row:
            raise ConfigError(f"keep_best: {self.cfg.keep_best!r} is not an evaluation metric here; "
                              f"evaluation gives {sorted(k[5:] for k in row if k.startswith('eval/'))}")
        path = self.run_dir / "best.json"
        best = json.loads(path.read_text()) if path.exists() else None
        state = full_state_dict(self.model) if self.params_sharded else None
        if best is not None and best["step"] <= self.step and row[key] <= best["value"]:
            return
        if self.rank == 0:
            with self._averaged():
                self.setup.export(self.run_dir / f"best_{self.setup.artifact}", state)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps({"metric": self.cfg.keep_best, "value": row[key], "step": after}))
            tmp.rename(path)
            log.info("best %s so far: %.2f after step %d", self.cfg.keep_best, row[key], after)

    def train_step(self) -> dict:
        """One RL step, in two phases: roll out and score this step's episodes, then update on them."""
        t_start = time.perf_counter()
        samples = self._step_samples()
        self._at("rollout")
        trajs, rstats = self._roll_out(samples)
        t_rollout = time.perf_counter() - t_start
        t0 = time.perf_counter()
        self._at("reward")
        experts = self._score(samples, trajs)
        t_reward = time.perf_counter() - t0
        t0 = time.perf_counter()
        self._at("update")
        ustats, pstats = self._update(trajs, experts)
        seconds = {"rollout": t_rollout, "reward": t_reward, "update": time.perf_counter() - t0,
                   "step": time.perf_counter() - t_start}
        row = {**trajectory_metrics(trajs), "lr": self.scheduler.get_last_lr()[0], "kl_coef": self.kl.value,
               **timing_metrics(trajs, rstats, seconds),
               "guard/rollbacks": float(self.watch.rollbacks), "guard/lr_scale": self.watch.lr_scale,
               **ustats, **pstats}
        if self.cfg.experts_per_group:   # the row's other means are the policy's own samples'
            row["experts"] = float(len(experts))
            row["expert_reward"] = sum(t.reward for t in experts) / len(experts) if experts else float("nan")
        self._dump_trajectories(trajs)
        # Bytes of Adam state on this rank (a 1/world share under ZeRO-1 or FSDP); the mean over ranks.
        row["optimizer_state_mb"] = optimizer_state_bytes(self.optimizer) / 2**20
        # Under several ranks: the step's metrics over all ranks' trajectories (rank 0 logs them).
        return reduce_metrics(row, weight=len(trajs), summed=("tokens_per_s",))

    def _step_samples(self) -> list[dict]:
        """This rank's share of the step's questions (the order depends on seed and step alone)."""
        cfg = self.cfg
        idx = step_questions(len(self.questions), self.step, cfg.questions_per_step, cfg.seed)
        return [self.questions[i] for i in idx[self.rank::self.world]]

    def _roll_out(self, samples: list[dict]):
        """Phase 1a: `rollout.n` episodes per question from the setup -> (trajectories, stats)."""
        cfg = self.cfg
        self.policy.eval()
        rcfg = replace(cfg.rollout, seed=cfg.seed * 1_000_003 + self.step * 101 + self.rank)
        with full_params(self.model):   # ranks generate different lengths: no per-layer gathers
            trajs, rstats = self.setup.rollout(samples, rcfg, self.rank * cfg.questions_per_step)
        if rstats.get("timeouts"):
            log.warning("step %d: %d of %d trajectories cut at the wall-time bound (rollout.max_episode_s / "
                        "max_rollout_s)", self.step, rstats["timeouts"], len(trajs))
        return trajs, rstats

    def _score(self, samples: list[dict], trajs: list) -> list:
        """Phase 1b: the step's reward on every episode (and on the expert episodes it adds) -> experts."""
        r = self.cfg.rollout
        experts = self.experts(samples, trajs, self.step) if self.experts is not None else []
        score_step(samples, trajs + experts, make_reward(self.rewards.at(self.step)),
                   retriever=self.setup.extras.get("retriever"),
                   question_depth=max(r.max_turns * r.max_queries_per_call * r.topk, 10),
                   timeout_reward=self.cfg.guard.timeout_reward)
        return experts

    def _update(self, trajs: list, experts: list) -> tuple[dict, dict]:
        """Phase 2: advantages and gradient steps on the episodes the policy learns from, then the
        scheduler, the weight average and the KL controller -> (update stats, preparation stats)."""
        cfg = self.cfg
        if experts:   # their old log-probs: the policy's before this step's update (eval mode, as it sampled)
            take_policy_logprobs(self.policy, experts, cfg.algo.micro_batch_size)
        self.policy.train()
        learn = [t for t in trajs if self.setup.trains(t)] + experts
        if not learn:
            raise ConfigError(f"step {self.step}: no trajectory to learn from (frozen_agents: {cfg.frozen_agents})")
        prep, ustats = update_on(self.policy, self.optimizer, learn, cfg.algo, self.kl.value, cfg.max_grad_norm,
                                 seed=cfg.seed * 7919 + self.step, step=self.step,
                                 critic_only=self.step < cfg.critic_warmup, single_rank=self.world == 1)
        self.scheduler.step()
        if self.ema is not None:
            self.ema.update(self.model)
        if prep is not None and "kl_ref" in prep.stats:
            self.kl.update(prep.stats["kl_ref"], len(trajs) * self.world)  # kl_ref is all-rank already
        self.policy.eval()
        return ustats, (prep.stats if prep is not None else {})

    def _dump_trajectories(self, trajs: list) -> None:
        """Every `log_trajectories_every` steps, the policy's own episodes (rank 0) as JSONL."""
        every = self.cfg.log_trajectories_every
        if every and self.step % every == 0 and self.rank == 0:
            (self.run_dir / "trajectories").mkdir(exist_ok=True)
            write_trajectories(self.run_dir / "trajectories" / f"step_{self.step:06d}.jsonl", trajs)

    def evaluate(self, per_question: bool = False) -> dict:
        """Greedy (LM) or deterministic top-k (retriever) held-out evaluation: metrics in percent
        with 95% CIs (EM/F1/cover-EM for an agent; recall@k and answer@k for a retriever).

        per_question=True adds {question id: {metric: 0-1}} under "per_question", so that two
        evaluations (e.g. before and after RL) can be compared with a paired bootstrap."""
        samples = load_questions(self.cfg.data.eval, limit=self.cfg.data.eval_n)
        self._at("evaluation")
        self.policy.eval()
        with full_params(self.model), self._averaged():
            return self.setup.evaluate(samples, self.cfg.seed, per_question)

    def _averaged(self):
        """The weights that are evaluated and exported: the moving average with `ema_decay`."""
        return self.ema.swapped_in(self.model) if self.ema is not None else contextlib.nullcontext()

    # ---------------------------------------------------------------- internals
    def _extra_modules(self):
        mods = dict(self.policy.extra_modules() or {})
        if self.ema is not None:
            mods["weight_average"] = self.ema
        return mods or None

    def _at(self, phase: str) -> None:
        """Where this rank is, for the others' messages if it dies or hangs (rank_watch)."""
        if self.ranks is not None:
            self.ranks.at(self.step, phase)

    def _save(self, pending_row: dict | None = None) -> None:
        self._at("checkpoint")
        if self.sharded:   # a collective: every rank sends its shard of the state to rank 0
            self.optimizer.consolidate_state_dict(to=0)
        model_state = opt_state = None
        if self.params_sharded:   # collectives too: the checkpoint holds whole tensors
            model_state, opt_state = full_state_dict(self.model), full_optimizer_state(self.optimizer)
        if self.rank != 0:
            return
        save_checkpoint(self.run_dir, self.step, model=self.model, optimizer=self.optimizer,
                        model_state=model_state, optimizer_state=opt_state,
                        scheduler=self.scheduler,
                        extra={"step": self.step, "kl": self.kl.state_dict(), "guard": self.watch.state_dict(),
                               **({"pending_row": pending_row} if pending_row is not None else {})},
                        keep_last=self.cfg.keep_last, extra_modules=self._extra_modules())

    def _load(self, ckpt: Path, rollback: bool = False) -> dict:
        """Restore a checkpoint; return its trainer state. A rollback keeps this run's remedy (its
        rollbacks, learning-rate scale and left-out questions) and takes only the rules' history."""
        # The checkpoint's RNG state is rank 0's; other ranks reseed from (seed, rank, step) so they
        # do not replay rank 0's random stream (rollout sampling is seeded per rank explicitly).
        state = load_checkpoint(ckpt, model=self.model, optimizer=self.optimizer, scheduler=self.scheduler,
                                extra_modules=self._extra_modules(), restore_rng=self.rank == 0)
        self.step = int(state["step"])
        if self.rank != 0:
            seed_everything(self.cfg.seed + 1_000_003 * self.rank + self.step)
        if "kl" in state:
            self.kl.load_state_dict(state["kl"])
        self.watch.load_state_dict(state.get("guard", {}), history_only=rollback)
        if self.watch.lr_scale != 1.0:
            scale_learning_rate(self.optimizer, self.scheduler, self.cfg.lr, self.watch.lr_scale)
        return state

