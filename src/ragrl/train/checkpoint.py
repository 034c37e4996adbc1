"""Crash-safe checkpoints that resume a run exactly.

Layout of one run's checkpoints:

    run_dir/checkpoints/
      step_000010/                  one complete checkpoint
        model.safetensors           full weights (plain model), or
        adapter_model.safetensors   LoRA weights + adapter_config.json (PeftModel.save_pretrained)
        {name}.safetensors          each extra trainable module (e.g. a value head)
        optimizer.pt  scheduler.pt  rng.pt
        trainer_state.json          {"step": 10, ...extra}: data position, epoch, KL state, ...
        manifest.json               size + SHA-256 of every other file; written last
      step_000020/
      latest                        text file naming the newest complete checkpoint dir

Sharded (FSDP) models are saved in this same single-process format: the trainer gathers the
shards and passes `model_state` / `optimizer_state` to rank 0's `save_checkpoint`; on load each
rank reads the whole tensors and keeps its shard (ragrl.policy.fsdp).

Why it survives a kill at any instant: a checkpoint is written into `.tmp_step_...`, every file
is fsynced, and only then is the directory renamed to `step_...` (rename is atomic). The `latest`
marker is replaced atomically after that. A kill leaves either the old marker (pointing at an old,
complete checkpoint) or the new one; a half-written `.tmp_` dir is never read and is removed by
the next save.

Damage after publishing (a copy cut short, a file deleted or rewritten by hand, bad storage) is
caught by the manifest: `latest_checkpoint` skips a checkpoint that does not match it, with a
warning, and resumes from the newest intact one instead; it raises rather than start from nothing.
"""
from __future__ import annotations

import json
import logging
import os
import re
import shutil
from pathlib import Path
from typing import Callable

import torch
from safetensors.torch import load_file, load_model, save_file, save_model
from torch import nn

from ragrl.errors import RagrlError, RunWriteFailed
from ragrl.policy.fsdp import is_sharded, load_full_state_dict, shard_optimizer_state
from ragrl.train.disk import write_failure_reason
from ragrl.train.manifest import MANIFEST, check_manifest, has_manifest, write_manifest
from ragrl.train.rng import get_rng_state, set_rng_state

log = logging.getLogger(__name__)

STEP_DIR = re.compile(r"^step_(\d+)$")
TMP_PREFIX = ".tmp_"
MARKER = "latest"
STATE_FILE = "trainer_state.json"
FULL_WEIGHTS = "model.safetensors"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
RESERVED_NAMES = {"model", "adapter_model", "optimizer", "scheduler", "rng", "trainer_state"}

# Test hook: called with the temporary dir after all files are written and fsynced, right before
# the rename that publishes the checkpoint. Lets a test kill the process mid-checkpoint.
_before_rename: Callable[[Path], None] | None = None


def checkpoints_dir(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints"


def step_dir_name(step: int) -> str:
    return f"step_{step:06d}"


# ---------------------------------------------------------------- saving

def save_checkpoint(run_dir: Path, step: int, *, model: nn.Module, optimizer=None, scheduler=None,
                    extra: dict | None = None, extra_modules: dict[str, nn.Module] | None = None,
                    keep_last: int | None = 3, model_state: dict | None = None,
                    optimizer_state: dict | None = None) -> Path:
    """Write `run_dir/checkpoints/step_{step:06d}/` atomically and point `latest` at it.

    `extra` must be JSON-serialisable (it goes to trainer_state.json). `keep_last=None` keeps
    every checkpoint. `model_state` / `optimizer_state`: whole-tensor state dicts to write
    instead of the live objects' own (a sharded model's, gathered). Returns the final dir.
    """
    if step < 0:
        raise RagrlError(f"checkpoint step must be >= 0, got {step}")
    if keep_last is not None and keep_last < 1:
        raise RagrlError(f"keep_last must be >= 1 (or None to keep all), got {keep_last}")
    extra_modules = dict(extra_modules or {})
    for name in extra_modules:
        if name in RESERVED_NAMES or not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
            raise RagrlError(f"extra module name {name!r} is reserved or not a plain file name")
    trainer_state = _trainer_state(step, extra)

    root = checkpoints_dir(run_dir)
    name = step_dir_name(step)
    tmp = root / f"{TMP_PREFIX}{name}"
    try:
        root.mkdir(parents=True, exist_ok=True)
        _remove_stale_tmp(root)
        tmp.mkdir()
        _write_files(tmp, step, model, optimizer, scheduler, trainer_state, extra_modules,
                     model_state, optimizer_state)
    except Exception as e:
        # A full disk (or a quota, or a read-only mount) mid-write: drop the half-written copy so
        # the next save and `latest_checkpoint` never meet it, and stop with the path and the free
        # space. The published checkpoints are untouched, so `--resume` goes on from the newest.
        # Not just OSError: torch.save reports a short write as a RuntimeError and safetensors
        # as a SafetensorError.
        shutil.rmtree(tmp, ignore_errors=True)
        raise RunWriteFailed(_write_failure(root, tmp, step, e)) from e

    if _before_rename is not None:
        _before_rename(tmp)
    final = root / name
    try:
        _publish(root, tmp, final)
        _write_marker(root, name)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise RunWriteFailed(_write_failure(root, final, step, e)) from e
    if keep_last is not None:
        _prune(root, keep_last, protect=name)
    log.info("saved checkpoint %s", final)
    return final


def _write_files(tmp: Path, step: int, model, optimizer, scheduler, trainer_state: dict,
                 extra_modules: dict, model_state, optimizer_state) -> None:
    """Every file of one checkpoint into `tmp`, the manifest last, then fsync them all."""
    _save_model_weights(model, tmp, model_state)
    for mod_name, module in extra_modules.items():
        save_model(module, str(tmp / f"{mod_name}.safetensors"))
    if optimizer is not None:
        torch.save(optimizer_state if optimizer_state is not None else optimizer.state_dict(),
                   tmp / "optimizer.pt")
    if scheduler is not None:
        torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
    torch.save(get_rng_state(), tmp / "rng.pt")
    (tmp / STATE_FILE).write_text(json.dumps(trainer_state, indent=2) + "\n")
    write_manifest(tmp, step)   # last: it must cover every file above
    _fsync_tree(tmp)


def _publish(root: Path, tmp: Path, final: Path) -> None:
    """Rename the finished `tmp` to `final` (atomic), replacing an older copy of the same step."""
    if final.exists():  # re-saving a step (e.g. after resuming): move the old copy out of the way
        old = root / f"{TMP_PREFIX}replaced_{final.name}"
        os.rename(final, old)
        os.rename(tmp, final)
        shutil.rmtree(old)
    else:
        os.rename(tmp, final)
    _fsync_dir(root)


def _write_failure(root: Path, path: Path, step: int, error: Exception) -> str:
    """One message for a checkpoint that could not be written: the path, why, the free space, and
    the checkpoint a `--resume` goes on from."""
    # Named only once verified: the newest dir may be one a resume already found damaged.
    intact = next((p for p in _candidates(root) if verify_checkpoint(p) is None), None)
    kept = (f"the previous intact checkpoint is {intact}" if intact is not None
            else "no earlier intact checkpoint exists")
    return (f"could not write checkpoint step {step} to {path}: {write_failure_reason(root, error)}; "
            f"{kept}. Free some space and run the same command with --resume")


def _trainer_state(step: int, extra: dict | None) -> dict:
    extra = dict(extra or {})
    if "step" in extra and extra["step"] != step:
        raise RagrlError(f"extra['step']={extra['step']} disagrees with checkpoint step {step}")
    for key, value in extra.items():
        try:
            json.dumps(value, allow_nan=True)
        except (TypeError, ValueError) as e:
            raise RagrlError(f"checkpoint extra[{key!r}] is not JSON-serialisable: {e}") from e
    return {"step": step, **{k: v for k, v in extra.items() if k != "step"}}


def _is_peft(model: nn.Module) -> bool:
    from peft import PeftModel  # late: peft takes ~3 s to import
    return isinstance(model, PeftModel)


def _save_model_weights(model: nn.Module, out: Path, state: dict | None = None) -> None:
    from peft import get_peft_model_state_dict  # late: peft takes ~3 s to import
    if _is_peft(model):
        saved = sum(t.numel() for a in model.peft_config
                    for t in get_peft_model_state_dict(model, state_dict=state, adapter_name=a).values())
        trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        if trainable > saved:
            log.warning("%d trainable parameters are outside the LoRA adapter and will not be "
                        "checkpointed; pass their modules as extra_modules", trainable - saved)
        model.save_pretrained(str(out), safe_serialization=True, state_dict=state)
    elif state is not None:
        # One name per tied group (as save_model writes): the copies gathered from shards no
        # longer share storage, so the groups come from the live model's parameters.
        save_file({k: v.contiguous() for k, v in state.items() if k not in _tied_duplicates(model)},
                  str(out / FULL_WEIGHTS), metadata={"format": "pt"})
    else:
        # save_model drops the duplicate names of tied weights (lm_head ↔ embed_tokens), which a
        # plain safetensors save_file of the state dict would refuse.
        save_model(model, str(out / FULL_WEIGHTS))


def _tied_groups(model: nn.Module) -> list[list[str]]:
    """Names sharing one parameter object (e.g. lm_head.weight ↔ model.embed_tokens.weight)."""
    groups: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        groups.setdefault(id(p), []).append(name)
    return [g for g in groups.values() if len(g) > 1]


def _tied_duplicates(model: nn.Module) -> set[str]:
    return {n for g in _tied_groups(model) for n in g[1:]}


def _fsync_tree(top: Path) -> None:
    for dirpath, _, filenames in os.walk(top):
        for fname in filenames:
            fd = os.open(os.path.join(dirpath, fname), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_dir(Path(dirpath))


def _fsync_dir(path: Path) -> None:
    """Make a directory's entries (new files, renames) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_marker(root: Path, name: str) -> None:
    tmp = root / f"{TMP_PREFIX}{MARKER}"
    with open(tmp, "w") as f:
        f.write(name + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, root / MARKER)
    _fsync_dir(root)


def _remove_stale_tmp(root: Path) -> None:
    """Delete leftovers of a save that was killed before its rename."""
    for path in root.glob(f"{TMP_PREFIX}*"):
        log.info("removing incomplete checkpoint leftover %s", path)
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()


def _prune(root: Path, keep_last: int, protect: str) -> None:
    """Keep the `keep_last` newest *intact* checkpoints, plus `protect` and the marker's.

    keep_last counts only checkpoints that verify, so pruning can never leave nothing but damaged
    ones to fall back on. Walking newest step first: `protect` (just written, its manifest just
    computed) counts without re-hashing; older ones are verified until keep_last intact ones are
    counted, and every dir past that point is deleted unverified. A damaged dir met before then
    is not counted and is left in place for inspection (latest_checkpoint reports it on resume).
    """
    marker, kept = _read_marker(root), 0
    for path in reversed(_step_dirs(root)):
        if path.name == protect:
            kept += 1
        elif path.name == marker:
            continue
        elif kept >= keep_last:
            shutil.rmtree(path)
        elif (problem := verify_checkpoint(path)) is None:
            kept += 1
        else:
            log.warning("checkpoint %s is damaged (%s); keeping it, but not counting it toward "
                        "keep_last=%d", path, problem, keep_last)


# ---------------------------------------------------------------- finding

def _step_dirs(root: Path) -> list[Path]:
    """Published checkpoint dirs, oldest first. `.tmp_` dirs never match STEP_DIR. Every
    `step_*` dir counts, even one without trainer_state.json: publishing is atomic, so such a
    dir is a damaged checkpoint (verify_checkpoint says so), not one still being written."""
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir()
             if (m := STEP_DIR.match(p.name)) and p.is_dir()]
    return [p for _, p in sorted(found)]


def _read_marker(root: Path) -> str | None:
    try:
        return (root / MARKER).read_text().strip()
    except (FileNotFoundError, UnicodeDecodeError):
        return None


def verify_checkpoint(ckpt_dir: Path) -> str | None:
    """None when the checkpoint is intact, else one sentence naming what is wrong and the file.

    Checks every file against manifest.json (size, then SHA-256). A checkpoint without a
    manifest (written by an older ragrl) passes if it has its trainer_state.json: there is
    nothing more to check it against, and old runs must keep resuming.
    """
    ckpt_dir = Path(ckpt_dir)
    if not ckpt_dir.is_dir():
        return f"checkpoint dir {ckpt_dir} does not exist"
    if has_manifest(ckpt_dir):
        return check_manifest(ckpt_dir)
    return None if (ckpt_dir / STATE_FILE).is_file() else f"{STATE_FILE} is missing"


def _candidates(root: Path) -> list[Path]:
    """The checkpoints to resume from, in order: the `latest` marker's, then every other `step_*` dir, newest first."""
    name = _read_marker(root)
    marked = root / name if name is not None and STEP_DIR.match(name) and (root / name).is_dir() else None
    return ([marked] if marked else []) + [p for p in reversed(_step_dirs(root)) if p != marked]


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The checkpoint dir to resume from, or None if the run has none.

    Candidates: the `latest` marker's checkpoint, then every other `step_*` dir, newest first;
    returns the first that verifies (verify_checkpoint), logging a warning for each one skipped.
    A missing, unreadable or stale marker is warned about too. Raises RagrlError when
    checkpoints exist but none is intact: silently starting the run over would be worse.
    """
    root = checkpoints_dir(run_dir)
    name = _read_marker(root)
    steps = _step_dirs(root)
    candidates = _candidates(root)
    marked = candidates[0] if candidates and candidates[0].name == name else None
    damaged: list[tuple[Path, str]] = []
    chosen = None
    for path in candidates:
        if (problem := verify_checkpoint(path)) is None:
            chosen = path
            break
        damaged.append((path, problem))
    if damaged and chosen is None:
        raise RagrlError(f"no intact checkpoint in {root} to resume from: "
                         + "; ".join(f"{p.name} is damaged ({why})" for p, why in damaged)
                         + ". Restore them from a copy, or move the checkpoints dir away to "
                         "start over")
    if marked is None and (name is not None or steps):
        log.warning("checkpoint marker %s names %r, which is not a complete checkpoint; using %s",
                    root / MARKER, name, chosen)
    for path, problem in damaged:
        log.warning("checkpoint %s is damaged (%s); resuming from %s instead",
                    path, problem, chosen.name)
    if chosen is not None and not has_manifest(chosen):
        log.warning("checkpoint %s has no %s (written by an older ragrl), so it cannot be "
                    "verified; resuming from it unchecked", chosen, MANIFEST)
    return chosen


# ---------------------------------------------------------------- loading

def load_checkpoint(ckpt_dir: Path, *, model: nn.Module, optimizer=None, scheduler=None,
                    extra_modules: dict[str, nn.Module] | None = None,
                    restore_rng: bool = True) -> dict:
    """Restore model (or LoRA adapter), extra modules, optimizer, scheduler and RNG in place.

    Returns the trainer_state dict ({"step": ..., **extra}). Raises RagrlError naming the file
    when a needed file is missing, corrupt or does not fit the given model.
    """
    ckpt_dir = Path(ckpt_dir)
    if not ckpt_dir.is_dir():
        raise RagrlError(f"checkpoint dir {ckpt_dir} does not exist")
    state = _load(ckpt_dir / STATE_FILE, lambda p: json.loads(p.read_text()))
    if not isinstance(state, dict) or not isinstance(state.get("step"), int):
        raise RagrlError(f"checkpoint file {ckpt_dir / STATE_FILE} has no integer 'step'")

    if is_sharded(model):
        _load_into_sharded(ckpt_dir, model)
    elif _is_peft(model):
        _load_adapters(ckpt_dir, model)
    else:
        path = ckpt_dir / FULL_WEIGHTS
        if not path.is_file() and (ckpt_dir / ADAPTER_WEIGHTS).is_file():
            raise RagrlError(f"checkpoint {ckpt_dir} holds a LoRA adapter but the model is not a "
                             "PeftModel; wrap it with the same LoRA config first")
        _load(path, lambda p: load_model(model, str(p), strict=True))
    for name, module in (extra_modules or {}).items():
        _load(ckpt_dir / f"{name}.safetensors", lambda p: load_model(module, str(p), strict=True))
    if optimizer is not None:
        _load(ckpt_dir / "optimizer.pt", lambda p: optimizer.load_state_dict(_torch_load(p)))
        shard_optimizer_state(optimizer)   # a no-op unless the parameters are sharded
    if scheduler is not None:
        _load(ckpt_dir / "scheduler.pt", lambda p: scheduler.load_state_dict(_torch_load(p)))
    if restore_rng:
        _load(ckpt_dir / "rng.pt", lambda p: set_rng_state(_torch_load(p)))
    log.info("loaded checkpoint %s (step %d)", ckpt_dir, state["step"])
    return state


def _torch_load(path: Path):
    # weights_only: a checkpoint is data, never code to run on load.
    return torch.load(path, map_location="cpu", weights_only=True)


def _load(path: Path, fn):
    """Run fn(path), turning a missing file or any read/shape failure into a RagrlError."""
    if not path.is_file():
        raise RagrlError(f"checkpoint file {path} is missing")
    try:
        return fn(path)
    except RagrlError:
        raise
    except Exception as e:  # safetensors, pickle, json and shape errors have no common base
        raise RagrlError(f"checkpoint file {path} is corrupt or does not fit: "
                         f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from e


def _load_adapters(ckpt_dir: Path, model: nn.Module) -> None:
    from peft import set_peft_model_state_dict  # late: peft takes ~3 s to import
    if (ckpt_dir / FULL_WEIGHTS).is_file() and not (ckpt_dir / ADAPTER_WEIGHTS).is_file():
        raise RagrlError(f"checkpoint {ckpt_dir} holds full model weights but the model is a "
                         "PeftModel; load it into the plain model instead")
    for adapter in model.peft_config:
        # save_pretrained puts the default adapter at the top and any other one in a subdir.
        adir = ckpt_dir if adapter == "default" else ckpt_dir / adapter
        result = _load(adir / ADAPTER_WEIGHTS, lambda p: set_peft_model_state_dict(
            model, load_file(str(p)), adapter_name=adapter))
        # strict=False inside peft: every base weight shows up as missing, so check the rest.
        missing = [k for k in result.missing_keys if "lora_" in k or "modules_to_save" in k]
        missing = [k for k in missing if f".{adapter}." in k or k.endswith(f".{adapter}")]
        if result.unexpected_keys or missing:
            raise RagrlError(f"checkpoint file {adir / ADAPTER_WEIGHTS} does not fit the model's "
                             f"adapter {adapter!r}: unexpected {result.unexpected_keys[:3]}, "
                             f"missing {missing[:3]}")


def _load_into_sharded(ckpt_dir: Path, model: nn.Module) -> None:
    """Whole tensors from the checkpoint into a sharded (FSDP) model: each rank keeps its shard."""
    own = model.state_dict().keys()
    if _is_peft(model):
        # The adapter file names `…lora_A.weight`; the live module `…lora_A.<adapter>.weight`.
        state = {}
        for adapter in model.peft_config:
            adir = ckpt_dir if adapter == "default" else ckpt_dir / adapter
            saved = _load(adir / ADAPTER_WEIGHTS, lambda p: load_file(str(p)))
            mine = {k.replace(f".{adapter}.", "."): k for k in own if "lora_" in k and f".{adapter}." in k}
            if sorted(saved) != sorted(mine):
                raise RagrlError(f"checkpoint file {adir / ADAPTER_WEIGHTS} does not fit the model's adapter "
                                 f"{adapter!r}: unexpected {sorted(set(saved) - set(mine))[:3]}, "
                                 f"missing {sorted(set(mine) - set(saved))[:3]}")
            state.update({mine[k]: v for k, v in saved.items()})
        _load(ckpt_dir / ADAPTER_WEIGHTS, lambda p: load_full_state_dict(model, state, strict=False))
        return
    path = ckpt_dir / FULL_WEIGHTS
    state = _load(path, lambda p: load_file(str(p)))
    for group in _tied_groups(model):   # put back the names save_file dropped
        have = [n for n in group if n in state]
        if have:
            state.update({n: state[have[0]] for n in group if n not in state})
    _load(path, lambda p: load_full_state_dict(model, state, strict=True))
