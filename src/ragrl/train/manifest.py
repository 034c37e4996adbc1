"""Checkpoint manifests: the size and SHA-256 of every file a checkpoint was written with.

`manifest.json` is the last file written into a checkpoint dir (ragrl.train.checkpoint):

    {"format": 1, "step": 10,
     "files": {"optimizer.pt": {"bytes": 1234, "sha256": "9f86d0..."},
               "other_adapter/adapter_model.safetensors": {...}, ...}}

It lists every other file in the dir, recursively, by '/'-separated relative path. Atomic
publishing already rules out half-written checkpoints; the manifest catches damage that happens
afterwards (a copy or sync cut short, a file deleted or overwritten by hand, bad storage), which
would otherwise surface as a confusing load error or, worse, load without any error at all.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path, PurePosixPath

MANIFEST = "manifest.json"
FORMAT = 1
_CHUNK = 1 << 20   # hash in 1 MiB reads: whole optimizer states need not fit in memory twice


def file_digest(path: Path) -> tuple[int, str]:
    """(size in bytes, hex SHA-256) of a file, read in 1 MiB chunks."""
    digest, size = hashlib.sha256(), 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return size, digest.hexdigest()


def write_manifest(ckpt_dir: Path, step: int) -> Path:
    """Write `ckpt_dir/manifest.json` covering every other file below ckpt_dir. Call it last."""
    ckpt_dir = Path(ckpt_dir)
    names = []
    for dirpath, _, filenames in os.walk(ckpt_dir):
        for fname in filenames:
            rel = (Path(dirpath) / fname).relative_to(ckpt_dir).as_posix()
            if rel != MANIFEST:
                names.append(rel)
    files = {}
    for rel in sorted(names):
        size, sha = file_digest(ckpt_dir / rel)
        files[rel] = {"bytes": size, "sha256": sha}
    path = ckpt_dir / MANIFEST
    path.write_text(json.dumps({"format": FORMAT, "step": step, "files": files}, indent=2) + "\n")
    return path


def has_manifest(ckpt_dir: Path) -> bool:
    # lexists: a dangling link or a dir in the manifest's place is a damaged manifest, not an
    # old checkpoint that never had one.
    return os.path.lexists(Path(ckpt_dir) / MANIFEST)


def check_manifest(ckpt_dir: Path) -> str | None:
    """None when every file the manifest lists is there with its size and SHA-256; else one
    sentence naming the first problem and its file. Files the manifest does not list are
    ignored: they are not part of what was saved, and nothing loads them blindly."""
    ckpt_dir = Path(ckpt_dir)
    try:
        files = _parse(json.loads((ckpt_dir / MANIFEST).read_text()))
    except (OSError, ValueError, TypeError) as e:   # ValueError: JSON or UTF-8 decoding
        return f"{MANIFEST} is unreadable: {e}"
    # Sizes first: a missing or truncated file (the common damage) is found without hashing.
    for rel, (size, _) in files.items():
        path = ckpt_dir / rel
        try:
            if not path.is_file():
                return f"{rel} is missing"
            actual = path.stat().st_size
        except OSError as e:
            return f"{rel} is unreadable: {e}"
        if actual != size:
            how = "truncated" if actual < size else "longer than written"
            return f"{rel} is {actual} bytes, the manifest says {size} ({how})"
    for rel, (_, sha) in files.items():
        try:
            _, actual_sha = file_digest(ckpt_dir / rel)
        except OSError as e:
            return f"{rel} is unreadable: {e}"
        if actual_sha != sha:
            return f"{rel} does not match its checksum (corrupted)"
    return None


def _parse(manifest) -> dict[str, tuple[int, str]]:
    """{relative path: (bytes, sha256)}, sorted; ValueError/TypeError if the structure is off."""
    if not isinstance(manifest, dict):
        raise TypeError("not a JSON object")
    if manifest.get("format") != FORMAT:
        raise ValueError(f"format {manifest.get('format')!r}, but this ragrl reads format {FORMAT}")
    files = manifest.get("files")
    if not isinstance(manifest.get("step"), int) or not isinstance(files, dict):
        raise TypeError("no integer 'step' or no 'files' object")
    out = {}
    for rel, entry in sorted(files.items()):
        parts = PurePosixPath(rel).parts
        # A listed path must stay inside the checkpoint dir: verifying never reads elsewhere.
        if not parts or rel.startswith("/") or ".." in parts:
            raise ValueError(f"file entry {rel!r} is not a path inside the checkpoint")
        if not (isinstance(entry, dict) and type(entry.get("bytes")) is int
                and isinstance(entry.get("sha256"), str)):
            raise TypeError(f"file entry {rel!r} has no integer 'bytes' and string 'sha256'")
        out[rel] = (entry["bytes"], entry["sha256"].lower())
    return out
