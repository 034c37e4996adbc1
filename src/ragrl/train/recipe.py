"""Run a recipe end to end: optional SFT warm start, then RL (what `ragrl train` does).

RAG-R1, SmartRAG and MMOA-RAG chain SFT and RL; R1-Searcher chains two RL stages through
`model.init_adapter`. The SFT adapter is written to <run_dir>/sft/adapter once and reused on
--resume, so a resumed run never repeats or changes its warm start.
"""
from __future__ import annotations

import logging
import random
from pathlib import Path

from ragrl.config import load_config
from ragrl.datasets import load_questions
from ragrl.errors import ConfigError
from ragrl.retrieval.base import Hit
from ragrl.train.config import TrainConfig

log = logging.getLogger("ragrl.train")


def resolve_recipe(recipe: str) -> Path:
    """A recipe file path, or a bundled recipe name such as `search_r1_grpo`."""
    p = Path(recipe)
    if p.exists():
        return p
    here = Path(__file__).resolve().parents[3] / "recipes" / f"{recipe.removesuffix('.yaml')}.yaml"
    if here.exists():
        return here
    known = sorted(x.stem for x in here.parent.glob("*.yaml")) if here.parent.exists() else []
    raise ConfigError(f"recipe not found: {recipe!r} (known: {', '.join(known) or 'none'})")


def load_train_config(recipe: str | None, overrides: list[str], variant: str | None = None) -> TrainConfig:
    path = resolve_recipe(recipe) if recipe else None
    return load_config(TrainConfig, path, overrides, variant=variant)


def sft_warm_start(cfg: TrainConfig, model, tok, retriever, out_dir: Path, progress=None):
    """Synthesize gold search episodes from the train split and fit the adapter on them."""
    from ragrl.train.sft import run_sft

    trajs = SFT_BUILDERS[cfg.sft.builder](cfg, model, tok, retriever)
    fit = [t for t in trajs if len(t.token_ids) <= cfg.sft.max_len]
    if len(fit) < len(trajs):
        log.info("SFT: %d of %d episodes are longer than sft.max_len=%d tokens and are left out",
                 len(trajs) - len(fit), len(trajs), cfg.sft.max_len)
    if not fit:
        raise ConfigError(f"sft.max_len={cfg.sft.max_len}: every SFT episode is longer; raise it")
    trajs = fit
    result = run_sft(model, tok, trajs, steps=cfg.sft.steps, batch_size=cfg.sft.batch_size, lr=cfg.sft.lr,
                     seed=cfg.seed, out_dir=out_dir, progress=progress)
    log.info("SFT: %d steps, loss %.3f -> %.3f in %.0f s", cfg.sft.steps, result.losses[0], result.losses[-1],
             result.seconds)
    from ragrl.train.policy import freeze_reference
    freeze_reference(model)   # RL that follows measures its KL against this warm-started policy
    return result


def warm_start_episodes(cfg: TrainConfig, tok, retriever) -> list:
    """The SFT episodes: gold search episodes whose answer the observations show, plus
    `sft.direct_frac` of episodes that answer at once (questions drawn at random)."""
    from ragrl.agents.registry import get_protocol
    from ragrl.retrieval.base import Hit
    from ragrl.retrieval.corpus import load_corpus
    from ragrl.paths import DEMO_CORPUS
    from ragrl.train.sft import direct_trajectory, synth_trajectory

    frac = cfg.sft.direct_frac
    if not 0.0 <= frac < 1.0:
        raise ConfigError(f"sft.direct_frac must be in [0, 1), got {frac!r}")
    from ragrl.paths import resolve_kit
    corpus = load_corpus(resolve_kit(cfg.data.corpus) if cfg.data.corpus else DEMO_CORPUS)
    passages = {corpus.ids[i]: Hit(corpus.ids[i], corpus.titles[i], corpus.texts[i], 0.0) for i in range(len(corpus))}
    protocol = get_protocol(cfg.agent)
    rng = random.Random(cfg.seed)
    samples = [s for s in load_questions(cfg.data.train) if s.get("gold_passage_ids")]
    if not samples:
        raise ConfigError(f"SFT needs training questions with gold_passage_ids; {cfg.data.train} has none")
    trajs = [synth_trajectory(tok, protocol, s, retriever, passages, cfg.rollout, rng) for s in samples]
    # Teach copying, not guessing: keep episodes whose answer is visible in what was retrieved.
    kept = [t for t in trajs if answer_visible(t)]
    log.info("SFT: %d of %d synthesised episodes show their answer in the observations", len(kept), len(trajs))
    trajs = kept or trajs
    n_direct = min(len(samples), round(frac * len(trajs) / (1.0 - frac)))
    if n_direct:
        trajs = trajs + [direct_trajectory(tok, protocol, s) for s in rng.sample(samples, n_direct)]
        log.info("SFT: %d of %d episodes answer without searching", n_direct, len(trajs))
    return trajs


def smartrag_episodes(cfg: TrainConfig, model, tok, retriever) -> list:
    """SmartRAG's warm start (ragrl.train.sft_smartrag): closed-book check by the model being
    warm-started (its LoRA is still zero: the base model), then direct or search targets."""
    from ragrl.agents.registry import get_protocol
    from ragrl.paths import resolve_kit, DEMO_CORPUS
    from ragrl.retrieval.corpus import load_corpus
    from ragrl.rollout.engines import make_engine
    from ragrl.train.sft_smartrag import closed_book_right, smartrag_targets

    samples = load_questions(cfg.data.train)
    if cfg.sft.max_questions:
        samples = random.Random(cfg.seed).sample(samples, min(cfg.sft.max_questions, len(samples)))
    corpus = load_corpus(resolve_kit(cfg.data.corpus) if cfg.data.corpus else DEMO_CORPUS)
    wanted = {pid for s in samples for pid in s.get("gold_passage_ids") or []}
    passages = {pid: Hit(pid, corpus.titles[i], corpus.texts[i], 0.0) for pid in wanted
                if (i := corpus.row(pid)) is not None}
    model.eval()
    known = closed_book_right(make_engine(cfg.model.engine, model, tok, max_batch_size=cfg.model.max_batch_size), samples, cfg.seed,
                              cfg.sft.known_if)
    trajs, counts = smartrag_targets(tok, get_protocol(cfg.agent), samples, known, retriever, passages,
                                     cfg.rollout, cfg.seed)
    log.info("SmartRAG SFT: %d answer directly (right closed-book), %d search, %d dropped (answer not in "
             "the documents)", counts["direct"], counts["search"], counts["dropped"])
    if not trajs:
        raise ConfigError(f"SmartRAG SFT built no episode from {cfg.data.train}")
    return trajs


def mmoa_episodes(cfg: TrainConfig, model, tok, retriever) -> list:
    """MMOA-RAG's warm start (ragrl.train.sft_mmoa): one example per agent per question."""
    from ragrl.agents.registry import get_protocol
    from ragrl.train.sft_mmoa import mmoa_sft_examples

    samples = load_questions(cfg.data.train)
    if cfg.sft.max_questions:
        samples = random.Random(cfg.seed).sample(samples, min(cfg.sft.max_questions, len(samples)))
    trajs, counts = mmoa_sft_examples(tok, get_protocol(cfg.agent), samples, retriever)
    log.info("MMOA SFT: %s examples per agent", counts)
    return trajs


SFT_BUILDERS = {"gold_search": lambda cfg, model, tok, retriever: warm_start_episodes(cfg, tok, retriever),
                "smartrag": smartrag_episodes, "mmoa": mmoa_episodes}


def answer_visible(traj) -> bool:
    """Whether a gold answer (normalised) occurs in the episode's observations (yes/no always do)."""
    from ragrl.rewards.qa import normalize_answer

    seen = normalize_answer(" ".join(t.observation for t in traj.turns))
    golds = [normalize_answer(g) for g in traj.golds]
    return any(g in ("yes", "no") or (g and f" {g} " in f" {seen} ") for g in golds)


def run_recipe(cfg: TrainConfig, *, resume: bool = False, time_budget_s: float | None = None) -> Path:
    """SFT warm start (if cfg.sft.steps and no init adapter), then RL; returns the run dir.

    time_budget_s bounds the RL steps alone (Trainer.train): a lent GPU's fixed call length,
    say, without guessing a step count; the SFT stage before them is not counted."""
    from ragrl.train.check import check_combinations
    from ragrl.train.distributed import close_distributed
    from ragrl.train.policy import build_policy
    from ragrl.train.trainer import Trainer, default_retriever

    check_combinations(cfg)   # a bad setting fails now, not after the SFT warm start
    run_dir = Path(cfg.out_dir)
    retriever = None   # the setup builds what its policy needs (a retriever policy samples its own)
    sft_adapter = run_dir / "sft" / "adapter"
    if cfg.sft.steps > 0 and not cfg.model.init_adapter:
        if not (resume and (sft_adapter / "adapter_config.json").exists()):
            retriever = default_retriever(cfg)
            model, tok, _ = build_policy(cfg.model)
            sft_warm_start(cfg, model, tok, retriever, run_dir / "sft")
            del model
        cfg.model.init_adapter = str(sft_adapter)
    trainer = Trainer(cfg, retriever=retriever)
    ok = False
    try:
        trainer.train(resume=resume, time_budget_s=time_budget_s)
        ok = True
    finally:
        close_distributed(ok=ok)
    return run_dir
