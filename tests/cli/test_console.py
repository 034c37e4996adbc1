"""What a real `ragrl train` run prints (the CLI in a subprocess: tiny random Llama, BM25 over 200
passages, 2 SFT warm-start steps, 2 RL steps, a checkpoint at each): ragrl's own lines and progress,
and no library chatter (INFO records of other loggers, transformers' "Loading weights" / "Writing
model shards" bars, faiss.loader) or warnings; `ragrl -v` brings the libraries' output back;
train.log keeps ragrl's INFO lines either way. Both runs show every warning once
(PYTHONWARNINGS=default), so a deprecated call from ragrl's code fails here even where Python would
hide it. Their output goes to pipes, not a terminal, as under nohup or in CI: progress comes as
plain lines on stderr (every step: RAGRL_PROGRESS_EVERY_S=0), without a bar's escape codes.
"""
import json
import logging
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from ragrl.datasets import load_questions

CHATTER = ("Loading weights", "Writing model shards", "faiss.loader", "sentence_transformers")
LOG_RECORD = re.compile(r"\b(DEBUG|INFO) ([\w.]+): ")
WARNING = re.compile(r"\b(\w*Warning): ")
PROGRESS = re.compile(r"^\[\d\d:\d\d:\d\d\] (?P<head>(SFT|RL) step \d+/\d+ (loss|reward)) \d+\.\d{3}\b.* · "
                      r"\d+\.\d s/step · ")


def library_info(text: str) -> list[str]:
    """Lines of INFO/DEBUG log records from loggers other than ragrl's."""
    return [line for line in text.splitlines()
            if (m := LOG_RECORD.search(line)) and not (m[2] == "ragrl" or m[2].startswith("ragrl."))]


def bad_warnings(text: str) -> list[str]:
    """Warnings raised from ragrl's own code (any category), and deprecations from anywhere."""
    return [line for line in text.splitlines() if (m := WARNING.search(line))
            and ("/ragrl/" in line or m[1] in ("FutureWarning", "DeprecationWarning", "UserWarning"))]


def write_jsonl(path: Path, rows) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_model_dir):
    from ragrl.paths import DEMO_CORPUS
    from ragrl.retrieval.corpus import load_corpus

    root = tmp_path_factory.mktemp("console")
    write_jsonl(root / "train.jsonl", load_questions("demo-train")[:4])
    write_jsonl(root / "eval.jsonl", load_questions("demo-eval")[:2])
    corpus = load_corpus(DEMO_CORPUS)
    write_jsonl(root / "corpus.jsonl", [{"id": corpus.ids[i], "title": corpus.titles[i], "text": corpus.texts[i]}
                                        for i in range(200)])
    sets = {"model.name": tiny_model_dir, "questions_per_step": 2, "rollout.n": 2, "rollout.max_turns": 2,
            "rollout.max_turn_tokens": 16, "rollout.max_response_tokens": 64, "sft.steps": 2, "sft.batch_size": 2,
            "eval_every": 0,
            "steps": 2, "save_every": 1, "data.train": root / "train.jsonl", "data.eval": root / "eval.jsonl",
            "data.corpus": root / "corpus.jsonl"}
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "RAGRL_HOME": str(root / "home"),
           "PYTHONWARNINGS": "default", "RAGRL_PROGRESS_EVERY_S": "0"}
    # the user's settings would win (the last two would make Rich draw its bar into the pipe)
    for name in ("HF_HUB_DISABLE_PROGRESS_BARS", "TRANSFORMERS_VERBOSITY", "FORCE_COLOR", "TTY_COMPATIBLE"):
        env.pop(name, None)

    def run(name: str, *options: str) -> dict:
        out = root / name
        cmd = [sys.executable, "-m", "ragrl.cli.main", *options, "train", "search_r1_grpo", "--variant", "tiny",
               *[a for k, v in {**sets, "out_dir": out}.items() for a in ("--set", f"{k}={v}")]]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
        return {"stdout": proc.stdout, "stderr": proc.stderr, "log": (out / "train.log").read_text()}

    return {"quiet": run("quiet"), "verbose": run("verbose", "-v")}


def test_the_console_shows_ragrl_and_no_library_chatter_or_warnings(runs):
    quiet = runs["quiet"]
    console = quiet["stdout"] + quiet["stderr"]
    assert not library_info(console), "library log lines on the console:\n" + "\n".join(library_info(console))
    assert not [c for c in CHATTER if c in console], console
    assert not bad_warnings(quiet["stderr"]), "warnings:\n" + "\n".join(bad_warnings(quiet["stderr"]))
    assert "INFO ragrl.train.checkpoint: saved checkpoint" in quiet["stderr"]   # ragrl's own log lines stay


def test_off_a_terminal_progress_is_plain_lines_on_stderr_for_sft_and_rl(runs):
    for run in runs.values():
        shown = [line for line in run["stderr"].splitlines() if PROGRESS.match(line)]
        assert [PROGRESS.match(line)["head"] for line in shown] == [
            "SFT step 1/2 loss", "SFT step 2/2 loss", "RL step 1/2 reward", "RL step 2/2 reward"], run["stderr"][-3000:]
        assert re.search(r" · ~\d+(m \d\ds|s) left$", shown[0]) and shown[-1].split(" · ")[-1].startswith("done after")
        assert "\x1b" not in run["stdout"] + run["stderr"]             # no terminal escape codes in the pipe
        assert "━" not in run["stdout"] + run["stderr"]                 # nor a bar's final frame


def test_verbose_brings_the_library_output_back(runs):
    verbose = runs["verbose"]["stderr"]
    # transformers' bars, which the quiet run hides (its INFO records came from faiss.loader, which a
    # BM25 run no longer imports)
    assert "Loading weights" in verbose, verbose[-3000:]
    quiet = runs["quiet"]["stdout"] + runs["quiet"]["stderr"]
    assert "Loading weights" not in quiet


def test_train_log_keeps_ragrl_info_either_way(runs):
    for run in runs.values():
        assert re.search(r"INFO ragrl\.train\.checkpoint: saved checkpoint .*step_000002", run["log"]), run["log"]
        # the log starts before the SFT warm start, not with the RL stage
        assert re.search(r"INFO ragrl\.train: SFT: 2 steps, loss", run["log"]), run["log"]


@pytest.fixture
def console_state(monkeypatch):
    """setup_console in this process, undone afterwards (the environment variable is left set, so
    setup_console does not touch it)."""
    from ragrl.cli.console import CHATTY_LOGGERS

    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    root, names = logging.getLogger(), ("ragrl", *CHATTY_LOGGERS)
    saved = root.level, list(root.handlers), {n: logging.getLogger(n).level for n in names}
    yield
    root.setLevel(saved[0])
    root.handlers[:] = saved[1]
    for name, level in saved[2].items():
        logging.getLogger(name).setLevel(level)


def emit_all() -> None:
    logging.getLogger("ragrl.train").info("question filter: kept 3 of 4 training questions")
    logging.getLogger("ragrl.train.checkpoint").info("saved checkpoint step_000001")
    logging.getLogger("ragrl.train").warning("the time budget ended")
    logging.getLogger("sentence_transformers.base.model").info("Loading SentenceTransformer model")


def test_a_narrating_job_shows_its_stage_results_and_warnings_only(console_state, capsys):
    from ragrl.cli.console import narrate, setup_console

    setup_console()
    emit_all()
    err = capsys.readouterr().err
    assert "saved checkpoint" in err and "the time budget ended" in err and "Loading" not in err
    narrate("question filter:")
    emit_all()
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "    question filter: kept 3 of 4 training questions"    # under the stage's line
    assert len(lines) == 2 and lines[1].endswith("WARNING ragrl.train: the time budget ended")
    setup_console(verbose=True)   # -v: everything, narrated or not
    emit_all()
    assert len(capsys.readouterr().err.splitlines()) == 4


def test_only_the_known_library_warning_is_filtered_and_only_without_verbose(console_state):
    from ragrl.cli.console import setup_console

    known = "`is_gradient_checkpointing` is deprecated and will be removed in v6."
    for verbose, shown in ((False, ["other"]), (True, [known, "other"])):
        setup_console(verbose)
        with warnings.catch_warnings(record=True) as got:
            warnings.warn(known, FutureWarning)
            warnings.warn("other", FutureWarning)
        assert [str(w.message) for w in got] == shown
