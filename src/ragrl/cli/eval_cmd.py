"""`ragrl eval`: run an agent and the baselines on the same questions; write a report."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Optional

import typer
from rich.progress import Progress


def _with_query_encoder(retriever, query_encoder):
    """The retriever with a trained query encoder on its dense side (deterministic top-k)."""
    if query_encoder is None:
        return retriever
    from ragrl.errors import ConfigError  # late: keeps `ragrl --help` instant
    from ragrl.models.query_encoder import QueryEncoder  # late: keeps `ragrl --help` instant
    from ragrl.retrieval.stochastic import StochasticRetriever  # late: keeps `ragrl --help` instant

    backend = getattr(getattr(retriever, "index", None), "backend", None)
    dense = getattr(backend, "dense", backend)
    if not hasattr(dense, "embeddings"):
        raise ConfigError("--query-encoder needs a local dense (or hybrid) index given with --index")
    return StochasticRetriever(dense, QueryEncoder(str(query_encoder)))


def _multi_hop_searches(base_retriever, trained_retriever, rc) -> dict:
    """The index's encoder and the trained one, each searching the run's `rc.hops` hops with its
    history settings (deterministic top k per hop, over the same dense index)."""
    from ragrl.models.query_encoder import QueryEncoder  # late: keeps `ragrl --help` instant
    from ragrl.retrieval.stochastic import multi_hop_searcher  # late: keeps `ragrl --help` instant

    backend = base_retriever.index.backend
    dense = getattr(backend, "dense", backend)
    encoders = {"index encoder": QueryEncoder(rc.encoder)}
    if trained_retriever is not base_retriever:
        encoders["trained encoder"] = trained_retriever.encoder
    return {name: multi_hop_searcher(dense, enc, rc) for name, enc in encoders.items()}


def register(app: typer.Typer) -> None:
    @app.command("view")
    def view(
        run_dir: Path = typer.Argument(..., help="an eval, quickstart or training directory"),
        out: Optional[Path] = typer.Option(None, "--out", help="the HTML file \\[default: RUN_DIR/view.html]"),
    ) -> None:
        """Write one self-contained HTML page to browse the directory's trajectories, retrieval results
        (base vs trained top k per question) and curves."""
        from ragrl.eval.viewer import write_view  # late: keeps `ragrl --help` instant

        typer.echo(f"wrote {write_view(run_dir, out)}")

    @app.command("eval")
    def eval_(
        run: Optional[Path] = typer.Option(None, "--run", help="a training run directory: model, adapter (or query encoder), protocol, index and rollout settings come from its config.yaml; explicit flags override"),
        agent: Optional[str] = typer.Option(None, "--agent", help="protocol: search_r1, rag_r1, r1_searcher, smartrag, mmoa \\[default: search_r1]"),
        model: Optional[str] = typer.Option(None, "--model", help="registry name, HF id or local path \\[default: smollm2-135m-instruct]"),
        adapter: Optional[Path] = typer.Option(None, "--adapter", help="a LoRA adapter dir (e.g. a run's final_adapter)"),
        index: Optional[str] = typer.Option(None, "--index", help="index dir or http:// URL (default: BM25 of the demo corpus)"),
        data: str = typer.Option("demo-eval", "--data", help="question file (JSONL[.gz]) or demo-eval"),
        n: int = typer.Option(200, "--n", min=1, help="number of questions (first n)"),
        systems: str = typer.Option("direct,naive_rag,agent", "--systems", help="comma list of direct,naive_rag,agent,retrieval (recall@k / answer@k of the retriever alone)"),
        query_encoder: Optional[Path] = typer.Option(None, "--query-encoder", help="a trained query encoder (a HARR run's final_encoder) for a dense index's queries; `retrieval` then compares it with the index's own encoder"),
        topk: Optional[int] = typer.Option(None, "--topk", min=1, help="\\[default: 3]"),
        max_turns: Optional[int] = typer.Option(None, "--max-turns", min=1, help="\\[default: 4]"),
        batch_size: int = typer.Option(32, "--batch-size", min=1),
        seed: int = typer.Option(0, "--seed"),
        search_threshold: Optional[float] = typer.Option(None, "--search-threshold", min=0.0, max=1.0,
                                                         help="SmartRAG's inference mode: search when P(search action) exceeds this, else answer (protocols whose steps start with the action, e.g. smartrag)"),
        engine_kind: Optional[str] = typer.Option(None, "--engine", help="auto, hf, static or vllm (a CUDA GPU, pip install 'ragrl\\[vllm]') \\[default: the run's model.engine, else auto]"),
        device: str = typer.Option("auto", "--device", help="auto (a CUDA GPU if there is one), cpu, cuda or cuda:N"),
        dtype: str = typer.Option("float32", "--dtype", help="the LM weights' precision while generating: float32, "
                                                             "or bfloat16 (faster where the hardware computes it "
                                                             "natively; greedy answers can differ from float32's)"),
        out: Path = typer.Option(Path("runs/eval"), "--out"),
    ) -> None:
        """Evaluate with greedy decoding; writes report.md/json, trajectories_*.jsonl and a bar chart."""

        from ragrl.datasets import load_questions  # late: keeps `ragrl --help` instant
        from ragrl.eval.harness import SYSTEMS, EvalConfig, evaluate  # late: keeps `ragrl --help` instant
        from ragrl.eval.plots import bar_chart  # late: keeps `ragrl --help` instant
        from ragrl.eval.report import format_table, write_report  # late: keeps `ragrl --help` instant
        from ragrl.eval.stats import summarize  # late: keeps `ragrl --help` instant
        from ragrl.models.lm_weights import load_policy  # late: keeps `ragrl --help` instant
        from ragrl.retrieval.resolve import make_retriever  # late: keeps `ragrl --help` instant
        from ragrl.rollout.multi_turn import RolloutConfig  # late: keeps `ragrl --help` instant
        from ragrl.train.config import TrainConfig  # late: keeps `ragrl --help` instant
        from ragrl.train.setup import default_retriever  # late: keeps `ragrl --help` instant

        from ragrl.compare.runs import answers_by_start, read_run  # late: keeps `ragrl --help` instant
        from ragrl.methods.base import runner_settings, settings_of  # late: keeps `ragrl --help` instant
        from ragrl.rollout.protocol import default_text_protocol, get_protocol  # late: keeps `ragrl --help` instant

        # The run as `ragrl compare` resolves it: its config, method record and trained artifact. How it
        # is evaluated is the record's to say (a retriever feeding a reader: HARR's).
        record = read_run(run, with_start=False) if run is not None else None
        trained = record.cfg if record is not None else None
        retriever_run = record is not None and record.evaluation == "retriever"
        rc = settings_of(trained, record.method) if retriever_run else None   # its encoder, hops and history
        rollout = replace(trained.rollout, temperature=0.0, n=1) if trained else RolloutConfig(temperature=0.0)
        agent = agent or (trained.agent if trained else default_text_protocol())
        model = model or (trained.model.name if trained else "smollm2-135m-instruct")
        if trained is not None:
            adapter = adapter or (None if retriever_run else record.trained)
            query_encoder = query_encoder or (record.trained if retriever_run else None)
            if index is None and trained.data.index:
                index = trained.data.index
            if index is None and retriever_run:
                from ragrl.retrieval.resolve import cached_dense_index  # late: keeps `ragrl --help` instant
                index = str(cached_dense_index(trained.data.corpus, trained.data.vectors, rc.encoder))
            if index is None and trained.data.corpus:
                from ragrl.retrieval.resolve import cached_bm25_index  # late: keeps `ragrl --help` instant
                index = str(cached_bm25_index(trained.data.corpus))
        topk = topk or rollout.topk or 3
        rollout = replace(rollout, topk=topk, max_turns=max_turns or (rollout.max_turns if trained else 4))
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
        from ragrl.engines.registry import require_engine  # late: keeps `ragrl --help` instant
        from ragrl.errors import ConfigError  # late: keeps `ragrl --help` instant
        from ragrl.policy.lm_model import eval_dtype, resolve_device  # late: keeps `ragrl --help` instant
        from ragrl.policy.model_config import ModelConfig, engine_for, engine_kind as kind_to_build  # late: as above

        # The run's `model:` section builds the engine, as in training and compare; --engine overrides its kind.
        model_section = trained.model if trained else ModelConfig()
        engine_kind = kind_to_build(engine_kind or model_section.engine, switches_adapters=(
            rollout.answer_by != "policy" or search_threshold is not None))
        try:   # before any work
            weights = eval_dtype(dtype)
        except ConfigError as error:
            raise typer.BadParameter(str(error), param_hint="--dtype")
        try:   # before any work
            torch_device = resolve_device(device, setting="--device")
        except ConfigError as error:
            raise typer.BadParameter(str(error), param_hint="--device")
        try:
            require_engine(engine_kind, setting="--engine")
        except ConfigError as error:
            raise typer.BadParameter(str(error), param_hint="--engine")
        if search_threshold is not None and engine_kind != "hf":
            raise typer.BadParameter("the threshold decision reads the first action token's probability from the "
                                     "HF model; use --engine hf", param_hint="--search-threshold")
        samples = load_questions(data, limit=n)
        retriever = make_retriever(index) if index else default_retriever(TrainConfig())
        if query_encoder is not None or want_retrieval:
            retriever, base_retriever = _with_query_encoder(retriever, query_encoder), retriever
        if want_retrieval:
            from ragrl.eval.retrieval import compare_retrievers, format_comparison  # late: keeps `ragrl --help` instant
            from ragrl.eval.retriever_view import ROWS_FILE, retrieval_rows, set_name, write_retrieval_rows  # late: as above

            searches = {"index encoder": base_retriever.search}
            if query_encoder is not None:
                searches["trained encoder"] = retriever.search
            if rc is not None and rc.hops > 1:
                # the run's own hops and history, for the index's encoder and the trained one alike
                searches = _multi_hop_searches(base_retriever, retriever, rc)
            hop_size = topk if rc is not None and rc.hops > 1 else None
            hits: dict = {}
            comp = compare_retrievers(searches, samples, topk, baseline="index encoder", hop_size=hop_size, hits_out=hits)
            out.mkdir(parents=True, exist_ok=True)
            # per question, for `ragrl view OUT`: each system's passages, gold and answer-bearing ones marked
            write_retrieval_rows(out / ROWS_FILE, retrieval_rows(
                samples, hits, {name: comp[name]["per_question"] for name in searches},
                set_name=set_name(data), hop_size=hop_size))
            table = format_comparison(comp, list(searches), "index encoder", f"retrieval on {data}")
            (out / "retrieval.md").write_text(table)
            (out / "retrieval.json").write_text(json.dumps(
                {**comp, "settings": {"index": index, "query_encoder": str(query_encoder) if query_encoder else None,
                                      "data_file": data, "n": len(samples), "k": comp["index encoder"]["k"],
                                      "hops": rc.hops if rc is not None else 1, "run": str(run.resolve()) if run else None}}, indent=1))
            typer.echo(table)
            typer.echo(f"per question: {out / ROWS_FILE} (browse: ragrl view {out})")
            if not chosen:
                return
        lm, tok = load_policy(model, device=torch_device)
        if adapter is not None:   # one shared LoRA adapter, or one per agent (MMOA-RAG per_agent)
            from ragrl.models.agent_adapters import load_adapters  # late: keeps `ragrl --help` instant

            # answer_by=start: a warm-started run's answers come from the start saved beside its adapter;
            # answer_by=base or reader: from the base model, so the adapter stays unmerged, to be switched off
            with_start = trained is not None and answers_by_start(trained)
            lm = load_adapters(lm, adapter, with_start=with_start, merge=rollout.answer_by == "policy")
        lm = lm.to(weights)   # after the merge, which is done in float32
        engine = agent_engine = engine_for(model_section, lm, tok, max_batch_size=batch_size, kind=engine_kind)
        if search_threshold is not None:
            from ragrl.engines.threshold import ThresholdDecisionEngine  # late: as above

            proto = get_protocol(agent)
            if getattr(proto, "think", True) is not None:
                raise typer.BadParameter(f"the {agent} protocol opens a step with reasoning, not the action; "
                                         "a threshold on the action needs a protocol like smartrag", param_hint="--search-threshold")
            # only the agent decides by threshold; the baselines keep the plain engine
            agent_engine = ThresholdDecisionEngine(engine, proto.query[0], proto.answer[0], search_threshold)
        # a run's own runner settings (MMOA-RAG's), at their evaluation values; without a run, the defaults
        own = runner_settings(trained, get_protocol(agent).runner, evaluation=True) if trained else None
        cfg = EvalConfig(agent=agent, systems=chosen, n=len(samples), batch_size=batch_size, topk=topk, seed=seed,
                         runner_settings=own)
        cfg.rollout = rollout

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
                                    "seed": seed, "decoding": "greedy", "weights": dtype, "search_threshold": search_threshold,
                                    "run": str(run) if run else None, "query_encoder": str(query_encoder) if query_encoder else None,
                                    "rollout": rollout.__dict__},
                     baseline=baseline)
        bar_chart(results, out / "report.png")
        typer.echo(format_table(results))
        typer.echo(f"report: {out / 'report.md'}")
