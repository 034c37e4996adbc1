"""HARR's own settings: the `retriever:` section of a recipe (the retriever as the policy), read when
`policy: retriever`. Defaults are HARR's GRPO settings."""
from __future__ import annotations

from dataclasses import dataclass

from ragrl.yaml_config import setting


@dataclass
class RetrieverSettings:
    """The retriever as the policy (HARR; `policy: retriever`). Defaults are HARR's GRPO settings."""

    encoder: str = setting("all-minilm-l6-v2", help=(
        "Query encoder (a sentence-transformers name or path): the dense index's encoder, trained on "
        "the query side only (the passage vectors stay the index's)."))
    lora: bool = setting(False, help="true: LoRA on the encoder (HARR); false: full fine-tuning.")
    lora_r: int = setting(8, help="LoRA rank of the encoder (with retriever.lora).")
    lora_alpha: int = setting(16, help="LoRA alpha (scale alpha / r) of the encoder (with retriever.lora).")
    pool: int = setting(30, help="Candidates fetched from faiss per query (M) that a draw ranks.")
    temperature: float = setting(0.05, help=(
        "Plackett-Luce temperature of a draw over the pool's scores (HARR: 0.05 with GRPO, 0.02 "
        "with PPO)."))
    history: bool = setting(True, help=(
        "HARR's history in the text a follow-up search embeds: `Original Question / History / "
        "Query` for a generator's sub-query, the question and what earlier hops found for a later "
        "hop without one. false: the query alone at every search (HARR's ablation)."))
    instruction: str = setting("", help=(
        "Text put before the query (for instruction-tuned encoders). Empty: none."))
    generator: str | None = setting(None, help=(
        "The frozen generator whose searches the retriever serves (a model name or path); its "
        "answer is rewarded. null: one retrieval per question with the question as the query and no "
        "generation (reward from the documents alone)."))
    generator_adapter: str | None = setting(None, help=(
        "A LoRA adapter for the generator, e.g. a trained search agent's final_adapter. null: none."))
    generator_temperature: float = setting(0.0, help=(
        "The generator's sampling temperature. 0: greedy, so rewards vary with the documents only."))
    hops: int = setting(1, help=(
        "Without a generator: searches per question. Each later hop embeds the question with the "
        "history of what earlier hops found and draws rollout.topk passages not found yet; "
        "evaluation then scores all hops' passages (k * hops)."))
    history_words: int = setting(8, help=(
        "Without a generator: what a later hop's query carries of each passage earlier hops drew: "
        "its title and first N words (where the next hop's entity is usually named)."))
    history_branches: int = setting(0, help=(
        "Without a generator and with hops > 1: the hops before the last are drawn once per block of "
        "rollout.n / history_branches trajectories of a group and shared by the block (a tree), so a "
        "later hop re-encodes at most this many distinct histories per question instead of "
        "rollout.n. 0: every trajectory draws every hop."))
    filter_questions: bool = setting(True, help=(
        "HARR's question filter: before training, keep only questions whose reward varies across a "
        "group of samples from the starting encoder (the kept ids are saved; a resume reuses them)."))


# Its numeric settings and the values that mean something (checked on load, as the core's).
RANGES = {
    **dict.fromkeys(("lora_r", "lora_alpha", "pool", "hops", "history_words"), "[1, inf)"),
    **dict.fromkeys(("generator_temperature", "history_branches"), "[0, inf)"),
    "temperature": "(0, inf)",
}
