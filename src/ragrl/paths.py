"""Where ragrl keeps caches and where the bundled demo data lives."""
from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

from ragrl.errors import RagrlError

try:   # the data kit's own package (data files and a path; optional: `pip install ragrl` alone lacks it)
    import ragrl_data
except ImportError:
    ragrl_data = None

DATA_DIR = Path(__file__).resolve().parent / "data"
DEMO_CORPUS = DATA_DIR / "corpus.jsonl.gz"
DEMO_TRAIN = DATA_DIR / "train.jsonl.gz"
DEMO_EVAL = DATA_DIR / "eval.jsonl.gz"
POOL_TRAIN = DATA_DIR / "pool_train.jsonl.gz"   # scripts/make_pool_data.py: dev-pool training questions
POOL_DEV = DATA_DIR / "pool_dev.jsonl.gz"       # 200 of them held apart, to choose settings on
SMARTRAG_TRAIN = DATA_DIR / "smartrag_train.jsonl.gz"   # PopQA + HotpotQA dev-pool questions
SMARTRAG_DEV = DATA_DIR / "smartrag_dev.jsonl.gz"       # 200 of them held apart
MULTIHOP_TRAIN = DATA_DIR / "multihop_train.jsonl.gz"   # HotpotQA + 2Wiki pool questions with evidence ids
MULTIHOP_DEV = DATA_DIR / "multihop_dev.jsonl.gz"       # HotpotQA / MuSiQue-train / 2Wiki held apart
AGENT_DEV = DATA_DIR / "agent_dev.jsonl.gz"             # 2Wiki dev-pool questions no search agent trains on
AGENT_CONFIRM = DATA_DIR / "agent_confirm.jsonl.gz"     # the rest of them, to confirm what agent-dev chose
KIT_PREFIX = "kit:"


def ragrl_home() -> Path:
    """Cache root: $RAGRL_HOME, default ~/.cache/ragrl."""
    return Path(os.environ.get("RAGRL_HOME", Path.home() / ".cache" / "ragrl")).expanduser()


@contextlib.contextmanager
def file_lock(path: Path):
    """An exclusive fcntl lock on `path` (created if missing), released when the process dies,
    so a crash never wedges it. Guards the caches under $RAGRL_HOME that several processes
    (the ranks of one run, or two runs) may try to fill at once."""
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def atomic_write_text(path: Path, text: str) -> None:
    """Write `path` whole or not at all: a sibling temporary file, synced, renamed over it, and the
    folder synced, so a crash or a full disk leaves the old file (or none), never a torn one, and a
    reader sees the old text or the new."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def data_kit() -> Path:
    """The offline data kit (51k-passage corpus, its MiniLM vectors, QA sets): the folder named by
    $RAGRL_DATA, else the installed `ragrl-data` package (the repository's `datakit/`, which
    ./install.sh installs). `ragrl data` reports which one is used and verifies it."""

    env = os.environ.get("RAGRL_DATA")
    if env:
        path = Path(env).expanduser()
        if not path.is_dir():
            raise RagrlError(f"RAGRL_DATA={env} is not a directory")
        return path
    if ragrl_data is None:
        raise RagrlError("the data kit is not installed: install it with `pip install ./datakit` from a ragrl "
                         "checkout (./install.sh does), or set RAGRL_DATA=/path/to/a/kit (corpus/, embeddings/, "
                         "eval/, train/)")
    return ragrl_data.ROOT


def resolve_kit(spec: str | Path) -> Path:
    """`kit:corpus/wiki_passages.jsonl.gz` → that file inside the data kit; anything else as is.

    >>> resolve_kit("some/file.jsonl")
    PosixPath('some/file.jsonl')
    """
    spec = str(spec)
    if not spec.startswith(KIT_PREFIX):
        return Path(spec).expanduser()

    path = data_kit() / spec[len(KIT_PREFIX):]
    if not path.exists():
        raise RagrlError(f"{spec}: no such file in the data kit ({path})")
    return path
