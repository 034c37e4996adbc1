"""MMOA-RAG (Chen et al., 2025): query rewriter -> retriever -> document selector -> answer
generator as cooperating agents of one LM, trained jointly with MAPPO (SFT warm start first)."""
from __future__ import annotations

from ragrl.methods.base import Method, register_method
from ragrl.methods.mmoa.pipeline import run_mmoa_episodes
from ragrl.methods.mmoa.protocol import MMOAProtocol, selector_f1
from ragrl.methods.mmoa.reward import check_mmoa_options, mmoa_reward
from ragrl.methods.mmoa.settings import MOVED_KEYS, MMOASettings, check_settings, evaluation_settings
from ragrl.methods.mmoa.sft import mmoa_episodes


def selector_metrics(trajs: list) -> dict:
    """Evaluation's selector F1 (percent) and documents kept per question, from the generators'
    trajectories, which carry what their selector kept (`keep_best: selector_f1`)."""
    if not all("selector_precision" in t.metrics for t in trajs):
        return {}
    return {"selector_f1": 100 * sum(selector_f1(t.metrics) for t in trajs) / len(trajs),
            "selector_kept": sum(len(t.metrics["selected"]) for t in trajs) / len(trajs)}


METHOD = register_method(Method(
    name="mmoa",
    paper="MMOA-RAG (Chen et al., 2025: multi-agent RL for RAG)",
    trains="rewriter, selector and generator agents of one LM (shared or per-agent LoRA), with MAPPO",
    protocols=(MMOAProtocol,),
    runners={"pipeline": run_mmoa_episodes},
    rewards={"mmoa": mmoa_reward},
    reward_checks={"mmoa": check_mmoa_options},
    answer_rewards=("mmoa",),
    sft_builders={"mmoa": mmoa_episodes},
    settings=MMOASettings,
    moved_keys=MOVED_KEYS,
    evaluation_settings=evaluation_settings,
    check=lambda cfg, settings: check_settings(settings),
    eval_metrics=selector_metrics,
    plot_keys=("eval/selector_f1",),
    evaluation="pipeline",
    recipes=("mmoa_mappo",),
))
