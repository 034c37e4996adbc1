"""`ragrl eval`: run an agent and the baselines on the same questions; write a report."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer


def _with_query_encoder(retriever, query_encoder):
    """The retriever with a trained query encoder on its dense side (deterministic top-k)."""
    if query_encoder is None:
        return retriever
    from ragrl.errors import ConfigError
    from ragrl.models.query_encoder import QueryEncoder
    from ragrl.retrieval.stochastic import StochasticRetriever

    backend = getattr(getattr(retriever, "index", None), "backend", None)
    dense = getattr(backend, "dense", backend)
    if not hasattr(dense, "embeddings"):
        raise ConfigError("--query-encoder needs a local dense (or hybrid) index given with --index")
    return StochasticRetriever(dense, QueryEncoder(str(query_encoder)))


def register(app: typer.Typer) -> None:
    @app.command("eval")
    def eval_(
        agent: str = typer.Option("search_r1", "--agent", help="protocol: search_r1, rag_r1, r1_searcher, smartrag"),
        model: str = typer.Option("smollm2-135m-instruct", "--model", help="registry name, HF id or local path"),
        adapter: Optional[Path] = typer.Option(None, "--adapter", help="a LoRA adapter dir (e.g. a run's final_adapter)"),
        index: Optional[str] = typer.Option(None, "--index", help="index dir or http:// URL (default: BM25 of the demo corpus)"),
        data: str = typer.Option("demo-eval", "--data", help="question file (JSONL[.gz]) or demo-eval"),
        n: int = typer.Option(200, "--n", min=1, help="number of questions (first n)"),
        systems: str = typer.Option("direct,naive_rag,agent", "--systems", help="comma list of direct,naive_rag,agent,retrieval (recall@k / answer@k of the retriever alone)"),
        query_encoder: Optional[Path] = typer.Option(None, "--query-encoder", help="a trained query encoder (a HARR run's final_encoder) for a dense index's queries; `retrieval` then compares it with the index's own encoder"),
        topk: int = typer.Option(3, "--topk", min=1),
        max_turns: int = typer.Option(4, "--max-turns", min=1),
        batch_size: int = typer.Option(32, "--batch-size", min=1),
        seed: int = typer.Option(0, "--seed"),
        search_threshold: Optional[float] = typer.Option(None, "--search-threshold", min=0.0, max=1.0,
                                                         help="SmartRAG's inference mode: search when P(search action) exceeds this, else answer (protocols whose steps start with the action, e.g. smartrag)"),
        device: str = typer.Option("auto", "--device", help="auto (a CUDA GPU if there is one), cpu, cuda or cuda:N"),
        out: Path = typer.Option(Path("runs/eval"), "--out"),
    ) -> None:
        """Evaluate with greedy decoding; writes report.md/json, trajectories_*.jsonl and a bar chart."""
        from dataclasses import replace

        from ragrl.datasets import load_questions
        from ragrl.eval.harness import SYSTEMS, EvalConfig, evaluate
        from ragrl.eval.plots import bar_chart
        from ragrl.eval.report import format_table, write_report
        from ragrl.eval.stats import summarize
        from ragrl.models.policy import load_policy
        from ragrl.retrieval.inprocess import make_retriever
        from ragrl.rollout.hf_engine import HFEngine
        from ragrl.train.config import TrainConfig
        from ragrl.train.trainer import default_retriever

        chosen = [s.strip() for s in systems.split(",") if s.strip()]
        want_retrieval = "retrieval" in chosen
        chosen = [s for s in chosen if s != "retrieval"]
        bad = [s for s in chosen if s not in SYSTEMS]
        if bad or not (chosen or want_retrieval):
            raise typer.BadParameter(f"unknown systems {bad}; choose from {', '.join(SYSTEMS)}, retrieval",
                                     param_hint="--systems")
        if query_encoder is not None and not (query_encoder / "modules.json").is_file():
            raise typer.BadParameter(f"{query_encoder} is not a sentence-transformers folder (no modules.json)",
                                     param_hint="--query-encoder")
        from ragrl.errors import ConfigError
        from ragrl.train.policy import resolve_device

        try:   # before any work
            torch_device = resolve_device(device, setting="--device")
        except ConfigError as error:
            raise typer.BadParameter(str(error), param_hint="--device")
        samples = load_questions(data, limit=n)
        retriever = make_retriever(index) if index else default_retriever(TrainConfig())
        if query_encoder is not None or want_retrieval:
            retriever, base_retriever = _with_query_encoder(retriever, query_encoder), retriever
        if want_retrieval:
            from ragrl.eval.retrieval import compare_retrievers, format_comparison

            searches = {"index encoder": base_retriever.search}
            if query_encoder is not None:
                searches["trained encoder"] = retriever.search
            comp = compare_retrievers(searches, samples, topk, baseline="index encoder")
            out.mkdir(parents=True, exist_ok=True)
            table = format_comparison(comp, list(searches), "index encoder", f"retrieval on {data}")
            (out / "retrieval.md").write_text(table)
            import json as _json
            (out / "retrieval.json").write_text(_json.dumps(
                {**comp, "settings": {"index": index, "query_encoder": str(query_encoder) if query_encoder else None,
                                      "data_file": data, "n": len(samples), "k": topk}}, indent=1))
            typer.echo(table)
            if not chosen:
                return
        lm, tok = load_policy(model, device=torch_device)
        if adapter is not None:
            from peft import PeftModel

            lm = PeftModel.from_pretrained(lm, str(adapter))
        engine = agent_engine = HFEngine(lm, tok, max_batch_size=batch_size)
        if search_threshold is not None:
            from ragrl.agents.registry import get_protocol
            from ragrl.rollout.decision_engine import ThresholdDecisionEngine

            proto = get_protocol(agent)
            if getattr(proto, "think", True) is not None:
                raise typer.BadParameter(f"the {agent} protocol opens a step with reasoning, not the action; "
                                         "a threshold on the action needs a protocol like smartrag", param_hint="--search-threshold")
            # only the agent decides by threshold; the baselines keep the plain engine
            agent_engine = ThresholdDecisionEngine(engine, proto.query[0], proto.answer[0], search_threshold)
        cfg = EvalConfig(agent=agent, systems=chosen, n=len(samples), batch_size=batch_size, topk=topk, seed=seed)
        cfg.rollout = replace(cfg.rollout, topk=topk, max_turns=max_turns)
        from rich.progress import Progress

        with Progress() as bar:
            tasks: dict[str, int] = {}

            def progress(system: str, done: int, total: int) -> None:
                if system not in tasks:
                    tasks[system] = bar.add_task(system, total=total)
                bar.update(tasks[system], completed=done)

            res = evaluate(engine, retriever, samples, replace(cfg, systems=[x for x in chosen if x != "agent"]),
                           progress=progress) if [x for x in chosen if x != "agent"] else {}
            if "agent" in chosen:
                res.update(evaluate(agent_engine, retriever, samples, replace(cfg, systems=["agent"]), progress=progress))
            res = {k: res[k] for k in [*(x for x in chosen if x != "agent"), *([agent] if "agent" in chosen else [])]}
        results = {s: {"trajectories": r["trajectories"],
                       "summary": summarize(r["trajectories"], r["wall_s"], per_question=True)} for s, r in res.items()}
        baseline = "naive_rag" if "naive_rag" in results and len(results) > 1 else None
        write_report(out, results, {"model": model, "adapter": str(adapter) if adapter else None, "agent": agent,
                                    "index": index or "bm25(demo corpus)", "data_file": data, "n": len(samples),
                                    "seed": seed, "decoding": "greedy", "search_threshold": search_threshold},
                     baseline=baseline)
        bar_chart(results, out / "report.png")
        typer.echo(format_table(results))
        typer.echo(f"report: {out / 'report.md'}")
