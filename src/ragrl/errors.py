"""User-facing errors. The CLI prints these as one clear line instead of a traceback."""


class RagrlError(Exception):
    """Base class for every error that names a user-fixable problem."""


class CorpusError(RagrlError):
    """A corpus file is malformed (the message names the file and line)."""


class IndexMismatchError(RagrlError):
    """An index was loaded against a different corpus or encoder than it was built with."""


class ModelError(RagrlError):
    """A model name could not be resolved or loaded."""


class ConfigError(RagrlError):
    """A recipe or --set override is invalid."""


class RunStopped(RagrlError):
    """A training run stopped on purpose with its last completed step checkpointed; the CLI exits
    with `exit_code`, so a scheduler can tell a fault worth retrying from a bad recipe (2)."""

    exit_code = 2


class RetrievalOutage(RunStopped):
    """The retrieval server stayed away past guard.retrieval_wait_s: `ragrl train --resume` goes on
    exactly once it is back."""

    exit_code = 75   # EX_TEMPFAIL (sysexits.h): a temporary failure, try again later


class TrainingCollapsed(RunStopped):
    """A collapse rule tripped again after guard.max_rollbacks rollbacks."""

    exit_code = 3


class RunWriteFailed(RunStopped):
    """A run's checkpoint or metrics row could not be written (a full disk, a quota, a read-only
    mount): a half-written checkpoint is removed, the earlier ones are intact, and the run stops;
    `ragrl train --resume` goes on from the newest once there is room."""

    exit_code = 74   # EX_IOERR (sysexits.h): retrying without freeing space would fail again


class RankLost(RunStopped):
    """Another rank of a distributed run died, froze, failed, or never reached a collective
    (ragrl.train.rank_watch): this rank stops too, naming it and the step; every rank started
    again with `--resume` goes on from the newest checkpoint."""

    exit_code = 69   # EX_UNAVAILABLE (sysexits.h): a peer the run needs is gone
