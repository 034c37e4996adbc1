"""What the `ragrl` command shows on the terminal: the one place that configures logging, warnings
and the libraries' progress bars for the CLI (`setup_console`, called by the app's callback).

By default the console shows ragrl's own output and nothing else:

  - ragrl's progress bars (Rich) and the lines its commands print; off a terminal, where a bar
    cannot draw, training prints plain progress lines to stderr instead (ragrl.train.progress);
  - ragrl's log records (`ragrl.*` loggers, INFO and up); a training run also writes them to
    <run dir>/train.log (ragrl.train.run_dir.setup_file_logging), whatever the console shows;
  - WARNING and above from every logger.

Library chatter is off:

  - third-party log records below WARNING (sentence_transformers' "Loading SentenceTransformer
    model from ...", faiss.loader's "Loading faiss with AVX2 support", ...): the root logger and
    the known chatty loggers are at WARNING, and the console handler passes other loggers' records
    only from WARNING up;
  - transformers' and huggingface_hub's tqdm bars ("Loading weights" at every model load,
    "Writing model shards" at every checkpoint): HF_HUB_DISABLE_PROGRESS_BARS=1, which both read
    when imported (an explicit HF_HUB_DISABLE_PROGRESS_BARS in the environment wins);
  - the warnings listed in KNOWN_WARNINGS: raised inside a library call that ragrl cannot avoid
    or change, each filtered by its message (and only that one).

`ragrl -v ...` / `ragrl --verbose ...` (setup_console(verbose=True)) brings all of it back: INFO
records from every logger (transformers keeps its own verbosity: TRANSFORMERS_VERBOSITY), the
libraries' progress bars and the filtered warnings.

A job that narrates its own stages (`ragrl quickstart`) calls `narrate()`: ragrl's INFO records
then go to the run's train.log only, except those whose message starts as it names: a stage's
result (shown indented under the stage, without the log prefix).
"""
from __future__ import annotations

import logging
import os
import sys
import warnings

CONSOLE_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# Loggers that announce routine work at INFO (the root logger's level covers the rest; these are
# set explicitly in case something else puts the root logger at INFO).
CHATTY_LOGGERS = ("faiss", "sentence_transformers", "huggingface_hub", "accelerate", "datasets",
                  "urllib3", "httpx", "filelock")
# (message regex, category, why it cannot be fixed in ragrl)
KNOWN_WARNINGS = [
    # peft's PeftModel.__init__ reads `model.is_gradient_checkpointing` (getattr(model, ..., True)),
    # a property transformers 5 deprecated in favour of `is_activation_checkpointing`: every
    # get_peft_model / PeftModel.from_pretrained warns, whatever the caller does.
    (r"`is_gradient_checkpointing` is deprecated", FutureWarning, "peft reads a deprecated transformers property"),
]
_HF_BARS = "HF_HUB_DISABLE_PROGRESS_BARS"


class ConsoleHandler(logging.StreamHandler):
    """The console's log handler. It writes to sys.stderr as it is at each record: under a live Rich
    progress bar that is Rich's proxy, which prints the line above the bar instead of through it."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)
        self.setFormatter(logging.Formatter(CONSOLE_FORMAT, "%H:%M:%S"))
        self.verbose = False
        self.narrated: tuple[str, ...] | None = None   # set by narrate(): how the INFO messages shown start

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _value) -> None:   # StreamHandler.__init__ / setStream: always the current stderr
        pass

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.WARNING or self.verbose:
            return super().filter(record)
        if not _is_ragrl(record.name):
            return False
        if self.narrated is not None and not record.getMessage().startswith(self.narrated):
            return False
        return super().filter(record)

    def format(self, record: logging.LogRecord) -> str:
        if self.narrated is not None and not self.verbose and record.levelno < logging.WARNING:
            return "    " + record.getMessage()   # a stage's result, under the stage's line
        return super().format(record)


def _is_ragrl(name: str) -> bool:
    return name == "ragrl" or name.startswith("ragrl.")


_set_hf_bars = False   # whether setup_console put HF_HUB_DISABLE_PROGRESS_BARS in the environment


def console_handler() -> ConsoleHandler | None:
    return next((h for h in logging.getLogger().handlers if isinstance(h, ConsoleHandler)), None)


def setup_console(verbose: bool = False) -> ConsoleHandler:
    """Configure logging, warnings and library progress bars for the command line (see the module
    docstring). Idempotent: a second call replaces the first one's settings."""
    global _set_hf_bars
    root = logging.getLogger()
    handler = console_handler()
    if handler is None:
        handler = ConsoleHandler()
        root.addHandler(handler)
    handler.verbose, handler.narrated = verbose, None
    root.setLevel(logging.INFO if verbose else logging.WARNING)
    # ragrl's records are made at INFO whatever the root level: the console shows them (unless a job
    # narrates itself) and a training run's train.log keeps them.
    logging.getLogger("ragrl").setLevel(logging.INFO)
    for name in CHATTY_LOGGERS:
        logging.getLogger(name).setLevel(logging.NOTSET if verbose else logging.WARNING)

    for message, category, _why in KNOWN_WARNINGS:
        filters = [f for f in warnings.filters if not (f[0] == "ignore" and getattr(f[1], "pattern", None) == message)]
        warnings.filters[:] = filters
        if not verbose:
            warnings.filterwarnings("ignore", message=message, category=category)

    if verbose:
        if _set_hf_bars:
            os.environ.pop(_HF_BARS, None)
            _set_hf_bars = False
        if "transformers" in sys.modules and os.environ.get(_HF_BARS) is None:
            from transformers.utils import logging as hf_logging  # late: only when already imported

            hf_logging.enable_progress_bar()
    elif _HF_BARS not in os.environ:
        os.environ[_HF_BARS] = "1"   # read by huggingface_hub and transformers at import (both lazy in ragrl)
        _set_hf_bars = True
        if "transformers" in sys.modules:   # already imported (a caller's own import): switch off now
            from transformers.utils import logging as hf_logging  # late: only when already imported

            hf_logging.disable_progress_bar()
    return handler


def narrate(*shown: str) -> None:
    """For a job that prints its own stage lines: ragrl's INFO records stay off the console (they
    still reach a run's train.log), except those whose message starts with one of `shown`, shown as
    indented lines. WARNING and above still show; nothing changes under --verbose."""
    handler = console_handler()
    if handler is not None:
        handler.narrated = tuple(shown)
