"""What a failed write of a run's files says: why it failed and how much room is left.

A full disk reaches ragrl in three dresses: `OSError(ENOSPC)` from Python's own files, a
`RuntimeError` from torch.save's zip writer ("unexpected pos ..."), and a `SafetensorError`
("I/O error: No space left on device (os error 28)"). The free space, read on the spot, is what
tells a user which of them happened.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path


def free_space(path: Path) -> str:
    """'12.3 MiB free on that file system' for the file system holding `path` (or its nearest
    existing parent)."""
    probe = Path(path)
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        return f"{shutil.disk_usage(probe).free / 2**20:.1f} MiB free on that file system"
    except OSError:
        return "the free space could not be read"


def write_failure_reason(path: Path, error: BaseException) -> str:
    """'No space left on device (0.0 MiB free on that file system)': the error in a few words,
    then the free space beside `path`."""
    if isinstance(error, OSError) and error.errno:
        why = os.strerror(error.errno)
    else:
        why = f"{type(error).__name__}: {(str(error).splitlines() or [''])[0]}"
    return f"{why} ({free_space(path)})"
