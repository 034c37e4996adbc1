"""A training run as `ragrl compare` reads it: its resolved config and method, the policy it kept
(best or final artifact) and the one it started from, the corpus and index it searched, the
questions it trained on, and how long it trained on which machine.

    run = read_run(Path("runs/search_r1_grpo_tiny"))
    run.trained, run.start            # adapter (or encoder) folders; start None = the base model
    check_comparable(run, setting)    # refuses another corpus or index, naming both
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from safetensors import safe_open

from ragrl.datasets import load_questions
from ragrl.errors import ConfigError
from ragrl.methods.base import Method, method_for, settings_of
from ragrl.models.agent_adapters import REFERENCE_ADAPTER, has_saved_start
from ragrl.paths import DEMO_CORPUS, resolve_kit
from ragrl.retrieval.corpus import file_sha256
from ragrl.retrieval.index import corpus_location, read_manifest
from ragrl.train.config import TrainConfig, load_train_file
from ragrl.train.run_dir import check_resolved_config, read_metrics, read_training_record


@dataclass(frozen=True)
class SearchSetting:
    """What a comparison searches: one corpus (by content) and one kind of index over it."""

    corpus: Path
    corpus_sha256: str
    index_kind: str          # bm25, dense, hybrid; "server" for a URL (its corpus cannot be read)
    index: str               # the index folder or URL, for messages and reports


@dataclass
class RunRecord:
    path: Path
    label: str               # the run folder's name: the table's row
    cfg: TrainConfig
    method: Method | None
    evaluation: str          # agent | pipeline | retriever (the method record's)
    trained: Path            # best_<artifact> (kept on held-apart questions), else final_<artifact>
    start: Path | None       # the adapter its RL began from (an earlier stage's start); None: the base
    search: SearchSetting


def find_artifact(run: Path, kind: str) -> Path | None:
    """The run's best_<kind> (chosen on its held-apart questions) if there is one, else final_<kind>."""
    for name in (f"best_{kind}", f"final_{kind}"):
        if (run / name).is_dir():
            return run / name
    return None


def load_run_config(run: Path) -> TrainConfig:
    """The resolved TrainConfig a run wrote (its config.yaml), checked like a recipe."""
    if not (run / "config.yaml").is_file():
        raise ConfigError(f"{run} has no config.yaml: not a ragrl training run directory")
    check_resolved_config(run / "config.yaml")
    return load_train_file(run / "config.yaml")


def check_artifact(path: Path, kind: str) -> None:
    """Refuse a trained artifact folder with a file missing or cut short, naming the file, before any
    model is loaded: an adapter needs its adapter_config.json and weights (per agent, for a run with
    an adapter per agent); every .safetensors file's header must fit the file."""
    weights = sorted(path.rglob("*.safetensors"))
    if not weights:
        raise ConfigError(f"{path} holds no .safetensors weights: the run's {kind} is incomplete")
    if kind == "adapter":
        for folder in sorted({w.parent for w in weights}):
            if not (folder / "adapter_config.json").is_file():
                raise ConfigError(f"{folder / 'adapter_config.json'} is missing: the run's adapter is incomplete")
    for file in weights:
        try:
            with safe_open(str(file), framework="pt") as f:
                f.keys()
        except Exception as e:   # noqa: BLE001 - safetensors' errors share no base class worth naming
            raise ConfigError(f"{file} is damaged ({type(e).__name__}: {str(e)[:200]}): the run's {kind} "
                              "cannot be loaded") from e


@lru_cache(maxsize=16)
def _sha(path: Path) -> str:
    return file_sha256(path)


def corpus_setting(corpus: str | None, index: str | None) -> SearchSetting:
    """The corpus and index a run (or a comparison) searches: `index` (folder or URL), else BM25
    over `corpus` (None: the bundled demo corpus), as ragrl.retrieval.resolve.retriever_for builds it."""
    if index and index.startswith(("http://", "https://")):
        path = resolve_kit(corpus) if corpus else DEMO_CORPUS
        return SearchSetting(path, "", "server", index)
    if index:
        folder = resolve_kit(index)
        manifest = read_manifest(folder)
        return SearchSetting(corpus_location(folder, manifest), manifest["corpus_sha256"], manifest["kind"], str(index))
    path = resolve_kit(corpus) if corpus else DEMO_CORPUS
    return SearchSetting(path, _sha(path), "bm25", f"bm25({path.name})")


def _init_adapter(run: Path, cfg: TrainConfig) -> Path | None:
    """The adapter the run itself was started from (model.init_adapter: an SFT adapter or an earlier
    stage's trained one), resolved from the working directory or, for its own SFT, from the run folder."""
    spec = cfg.model.init_adapter
    if not spec:
        return None
    path = Path(spec)
    if path.is_dir():
        return path
    own = run / "sft" / "adapter"
    if path.parts[-2:] == ("sft", "adapter") and own.is_dir():
        return own
    raise ConfigError(f"{run}: its starting adapter {spec} (model.init_adapter) is not there; "
                      "run `ragrl compare` from the folder the run was trained in")


def _start_adapter(run: Path, cfg: TrainConfig, seen: tuple[Path, ...] = ()) -> Path | None:
    """Where the run's RL began: its init adapter, or, when that is another run's trained adapter
    (R1-Searcher's stage 2 from stage 1's final_adapter), that run's start, followed back, so a staged
    method is paired against the policy before any of its RL."""
    path = _init_adapter(run, cfg)
    if path is None:
        return None
    earlier = path.parent
    if path.name in ("best_adapter", "final_adapter") and (earlier / "config.yaml").is_file():
        if earlier.resolve() in seen:
            raise ConfigError(f"{run}: its starting adapters form a loop through {earlier}")
        return _start_adapter(earlier, load_run_config(earlier), seen + (earlier.resolve(),))
    return path


def answers_by_start(cfg: TrainConfig) -> bool:
    """Whether a run's answers are written by the frozen start saved beside its adapter
    (`rollout.answer_by: start` on a warm-started run; from the base model, the base answers with the
    adapters off, which needs nothing saved)."""
    return cfg.rollout.answer_by == "start" and bool(cfg.model.init_adapter)


def read_run(path: Path, with_start: bool = True) -> RunRecord:
    """A run folder as every evaluation resolves it (`ragrl compare`, `ragrl eval --run`): its config,
    its method record and how that evaluates it, its trained artifact and, `with_start`, the adapter
    it started from. Refuses a run with nothing trained to evaluate."""
    path = Path(path)
    cfg = load_run_config(path)
    method = method_for(cfg.agent, cfg.policy)
    evaluation = method.evaluation if method is not None else "agent"
    kind = "encoder" if evaluation == "retriever" else "adapter"
    trained = find_artifact(path, kind)
    if trained is None:
        raise ConfigError(f"{path} has no best_{kind} or final_{kind}: the run has not finished "
                          f"(`ragrl train ... --resume` ends it)")
    check_artifact(trained, kind)
    # without the start that writes its answers the base model would, so the run is refused here,
    # before any model is loaded
    if kind == "adapter" and answers_by_start(cfg) and not has_saved_start(trained):
        raise ConfigError(f"{trained} holds no frozen start ({REFERENCE_ADAPTER}/ beside its adapter) to write "
                          "the answers (rollout.answer_by=start): copy the run folder whole")
    start = None if evaluation == "retriever" or not with_start else _start_adapter(path, cfg)
    if start is not None:
        check_artifact(start, "adapter")
    if evaluation == "retriever":    # its index is its policy's: only the corpus is shared
        search = corpus_setting(cfg.data.corpus, cfg.data.index)
        search = SearchSetting(search.corpus, search.corpus_sha256, "dense",
                               cfg.data.index or f"dense({settings_of(cfg, method).encoder} over {search.corpus.name})")
    else:
        search = corpus_setting(cfg.data.corpus, cfg.data.index)
    return RunRecord(path, path.name, cfg, method, evaluation, trained, start, search)


def check_comparable(run: RunRecord, setting: SearchSetting, *, allow_mismatch: bool = False) -> None:
    """Refuse a run that searched another corpus, or (an agent) another kind of index, than the
    comparison: its numbers would differ for that reason alone. A retriever run brings its own
    (dense) index, since the index's query side is what it trained; its corpus must still match."""
    if allow_mismatch:
        return
    hint = "; pass --allow-mismatch to compare it anyway (the table then names each row's index)"
    if run.search.index_kind == "server" or setting.index_kind == "server":
        raise ConfigError(f"{run.label} or the comparison searches a retrieval server "
                          f"({run.search.index if run.search.index_kind == 'server' else setting.index}), whose "
                          f"corpus cannot be checked against the other's{hint}")
    if run.search.corpus_sha256 != setting.corpus_sha256:
        raise ConfigError(f"{run.label} was trained on corpus {run.search.corpus} (sha256 "
                          f"{run.search.corpus_sha256[:12]}), but the comparison searches {setting.corpus} "
                          f"(sha256 {setting.corpus_sha256[:12]}){hint}")
    if run.evaluation != "retriever" and run.search.index_kind != setting.index_kind:
        raise ConfigError(f"{run.label} searched a {run.search.index_kind} index ({run.search.index}), but the "
                          f"comparison's is {setting.index_kind} ({setting.index}){hint}")


def check_held_out(run: RunRecord, questions: list[dict]) -> None:
    """Refuse a comparison question the run trained on (by id, or by its text)."""
    trained_on = load_questions(run.cfg.data.train)
    ids = {str(q.get("id")) for q in trained_on}
    texts = {" ".join(q["question"].lower().split()) for q in trained_on}
    seen = [q for q in questions if str(q.get("id")) in ids or " ".join(q["question"].lower().split()) in texts]
    if seen:
        raise ConfigError(f"{len(seen)} of the comparison's questions are in {run.label}'s training data "
                          f"({run.cfg.data.train}), e.g. {seen[0].get('id')!r}: {seen[0]['question'][:80]!r}; "
                          "compare on held-out questions")


def _parent_run(run_dir: Path, start: Path | None) -> Path | None:
    """The run folder a start adapter came from when it is another run's (R1-Searcher's stage 1)."""
    if start is None:
        return None
    for folder in Path(start).resolve().parents:
        if (folder / "config.yaml").is_file():
            return None if folder == run_dir.resolve() else folder
    return None


def _rl_seconds_from_metrics(run_dir: Path) -> float | None:
    times = [r["time/step_s"] for r in read_metrics(run_dir) if isinstance(r.get("time/step_s"), (int, float))]
    return float(sum(times)) if times else None


def _stage_time(stages: list[dict]) -> tuple[float, list[str], str]:
    return (sum(s["seconds"] for s in stages), sorted({s["machine"] for s in stages}),
            " + ".join(f"{s['stage']} {s['seconds'] / 60:.1f} min" for s in stages))


def _sft_time(run_dir: Path) -> dict:
    """The recorded SFT stage of a run whose warm start another run started from."""
    stages = [s for s in (read_training_record(run_dir) or {}).get("stages", []) if s["stage"] == "sft"]
    seconds, machines, how = _stage_time(stages) if stages else (None, [], "no recorded SFT stage")
    return {"seconds": seconds, "machine": "; ".join(machines), "how": how}


def training_time(run: RunRecord) -> dict:
    """{"seconds", "machine", "how"}: the run's recorded stage times (training.json), else its RL
    steps' own times from metrics.jsonl (SFT and evaluations unknown: `how` says so). A start
    adapter from another run (an earlier stage) adds that run's time: all of it for its final
    adapter, its SFT stage alone for its `sft/adapter` (a run that shares another's warm start)."""
    record = read_training_record(run.path)
    if record is not None and record["stages"]:
        seconds, machines, how = _stage_time(record["stages"])
    else:
        seconds, machines, how = _rl_seconds_from_metrics(run.path), [], "RL steps only (no training.json)"
    began = _init_adapter(run.path, run.cfg)   # the adapter it was started from, not where its RL began
    parent = _parent_run(run.path, began)
    if parent is not None:
        first = Path(began).resolve().relative_to(parent.resolve()).parts[0]
        # A warm start is trained from the base model (ragrl train runs SFT only without an init
        # adapter), so its run's SFT stage has no earlier run of its own; the run need not be finished.
        earlier = (_sft_time(parent) if first == "sft" else training_time(read_run(parent)))
        if seconds is not None and earlier["seconds"] is not None:
            seconds += earlier["seconds"]
        machines = sorted(set(machines) | set(earlier["machine"].split("; ")) - {""})
        how = f"{how}; after {parent.name}{' (its SFT stage)' if first == 'sft' else ''} ({earlier['how']})"
    return {"seconds": seconds, "machine": "; ".join(machines), "how": how}
