"""Checkpoints: exact resume (full model and LoRA), pruning, crash safety, clear errors."""
import hashlib
import json
import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from peft import LoraConfig, get_peft_model

from ragrl.errors import RagrlError
from ragrl.models.tiny import make_tiny_model
from ragrl.train.checkpoint import (
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
    verify_checkpoint,
)
from ragrl.train.rng import get_rng_state, seed_everything, set_rng_state

POOL = torch.randint(0, 49152, (4, 16), generator=torch.Generator().manual_seed(0))


def draw_all():
    return (random.random(), np.random.rand(3).tolist(), torch.rand(3).tolist())


def test_rng_state_round_trip_through_torch_save(tmp_path):
    seed_everything(123)
    draw_all()
    torch.save(get_rng_state(), tmp_path / "rng.pt")
    expected = [draw_all() for _ in range(3)]
    np.random.normal()  # leaves a cached gauss in NumPy's state: it must be restored too
    seed_everything(7)
    set_rng_state(torch.load(tmp_path / "rng.pt", weights_only=True))
    assert [draw_all() for _ in range(3)] == expected


def train_steps(model, optimizer, scheduler, n, value_head=None):
    """n optimizer steps; each draws from python, NumPy and torch RNGs, so resume must restore
    all three to reproduce the losses. Returns the losses."""
    model.train()
    losses = []
    for _ in range(n):
        rows = np.random.permutation(len(POOL))[:2]          # NumPy: which rows
        length = random.randint(8, POOL.shape[1])              # python: crop length
        ids = POOL[rows, :length]
        labels = ids.clone()
        labels[torch.rand(ids.shape) < 0.2] = -100             # torch: which tokens count
        out = model(input_ids=ids, labels=labels, output_hidden_states=value_head is not None)
        loss = out.loss
        if value_head is not None:
            loss = loss + value_head(out.hidden_states[-1]).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
        losses.append(loss.item())
    return losses


def make_optim(params):
    optimizer = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0 / (1 + s))
    return optimizer, scheduler


def snapshot(*modules):
    return [t.detach().clone() for m in modules for t in m.state_dict().values()]


def test_full_model_resume_is_exact(tmp_path):
    seed_everything(0)
    model, _ = make_tiny_model(seed=0)
    optimizer, scheduler = make_optim(model.parameters())
    train_steps(model, optimizer, scheduler, 2)
    ckpt = save_checkpoint(tmp_path, 2, model=model, optimizer=optimizer, scheduler=scheduler,
                           extra={"epoch": 0, "data_pos": 4, "kl_coef": 0.05})
    assert sorted(os.listdir(ckpt)) == ["manifest.json", "model.safetensors", "optimizer.pt",
                                        "rng.pt", "scheduler.pt", "trainer_state.json"]
    # The tied lm_head/embedding is stored once (~12.6 MB of the ~13 MB).
    assert (ckpt / "model.safetensors").stat().st_size < 14e6
    expected_losses = train_steps(model, optimizer, scheduler, 2)
    expected_params = snapshot(model)

    fresh, _ = make_tiny_model(seed=1)  # different weights: loading must overwrite them all
    optimizer2, scheduler2 = make_optim(fresh.parameters())
    seed_everything(999)  # scramble RNGs: loading must restore them
    assert latest_checkpoint(tmp_path) == ckpt
    state = load_checkpoint(ckpt, model=fresh, optimizer=optimizer2, scheduler=scheduler2)
    assert state == {"step": 2, "epoch": 0, "data_pos": 4, "kl_coef": 0.05}
    assert scheduler2.last_epoch == 2
    assert fresh.lm_head.weight.data_ptr() == fresh.model.embed_tokens.weight.data_ptr()
    losses = train_steps(fresh, optimizer2, scheduler2, 2)
    assert losses == pytest.approx(expected_losses, abs=1e-6)
    for a, b in zip(snapshot(fresh), expected_params):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)

    # Control: without the RNG state the replayed steps differ, so the check above has teeth.
    load_checkpoint(ckpt, model=fresh, optimizer=optimizer2, scheduler=scheduler2,
                    restore_rng=False)
    assert train_steps(fresh, optimizer2, scheduler2, 2) != pytest.approx(expected_losses,
                                                                          abs=1e-6)


def lora_model(seed):
    base, _ = make_tiny_model(seed=0)  # the frozen base comes from elsewhere, always the same
    torch.manual_seed(seed)  # LoRA A matrices (and the value head) start differently per seed
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.1,
                                            target_modules=["q_proj", "v_proj"]))
    value_head = torch.nn.Linear(64, 1)
    trainable = [p for p in model.parameters() if p.requires_grad] + list(value_head.parameters())
    return model, value_head, *make_optim(trainable)


def test_lora_resume_is_exact_and_saves_only_the_adapter(tmp_path):
    seed_everything(0)
    model, head, optimizer, scheduler = lora_model(seed=0)
    train_steps(model, optimizer, scheduler, 2, value_head=head)
    ckpt = save_checkpoint(tmp_path, 2, model=model, optimizer=optimizer, scheduler=scheduler,
                           extra_modules={"value_head": head}, extra={"epoch": 1})
    files = set(os.listdir(ckpt))
    assert {"adapter_model.safetensors", "adapter_config.json", "value_head.safetensors"} <= files
    assert "model.safetensors" not in files
    assert (ckpt / "adapter_model.safetensors").stat().st_size < 100_000  # no base weights
    expected_losses = train_steps(model, optimizer, scheduler, 2, value_head=head)
    expected_params = snapshot(model, head)

    fresh, head2, optimizer2, scheduler2 = lora_model(seed=1)
    seed_everything(999)
    state = load_checkpoint(latest_checkpoint(tmp_path), model=fresh, optimizer=optimizer2,
                            scheduler=scheduler2, extra_modules={"value_head": head2})
    assert state == {"step": 2, "epoch": 1}
    losses = train_steps(fresh, optimizer2, scheduler2, 2, value_head=head2)
    assert losses == pytest.approx(expected_losses, abs=1e-6)
    for a, b in zip(snapshot(fresh, head2), expected_params):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    with pytest.raises(RagrlError, match="LoRA adapter"):
        load_checkpoint(ckpt, model=make_tiny_model(seed=0)[0])  # forgot to wrap with LoRA


def small_model():
    return torch.nn.Linear(4, 2)


def step_dirs(run_dir):
    return sorted(p.name for p in (run_dir / "checkpoints").iterdir() if p.name != "latest")


def test_keep_last_prunes_old_but_never_the_latest(tmp_path):
    for step in (10, 20, 30, 40):
        save_checkpoint(tmp_path, step, model=small_model(), keep_last=2)
    assert step_dirs(tmp_path) == ["step_000030", "step_000040"]
    assert latest_checkpoint(tmp_path).name == "step_000040"
    # Re-saving an earlier step (a resumed run) makes it latest; pruning must keep it even though
    # it is not among the numerically newest.
    save_checkpoint(tmp_path, 5, model=small_model(), keep_last=1)
    assert step_dirs(tmp_path) == ["step_000005", "step_000040"]
    assert latest_checkpoint(tmp_path).name == "step_000005"
    save_checkpoint(tmp_path, 40, model=small_model(), keep_last=None, extra={"again": True})
    assert load_checkpoint(latest_checkpoint(tmp_path), model=small_model())["again"] is True


def test_kill_during_checkpoint_write_keeps_previous_checkpoint(tmp_path):
    run_dir, ready = tmp_path / "run", tmp_path / "ready"
    run_dir.mkdir()
    worker = Path(__file__).with_name("ckpt_kill_worker.py")
    proc = subprocess.Popen([sys.executable, str(worker), str(run_dir), str(ready)],
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        deadline = time.monotonic() + 120
        while not ready.exists():
            assert proc.poll() is None, f"worker exited early with {proc.returncode}"
            assert time.monotonic() < deadline, "worker never reached checkpoint 2"
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    root = run_dir / "checkpoints"
    leftover = root / ".tmp_step_000002"
    assert (leftover / "optimizer.pt").is_file()  # the kill really hit checkpoint 2 mid-way
    assert (root / "latest").read_text().strip() == "step_000001"
    assert latest_checkpoint(run_dir) == root / "step_000001"

    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    state = load_checkpoint(root / "step_000001", model=model, optimizer=optimizer)
    assert state == {"step": 1, "data_pos": 32}
    expected = torch.load(run_dir / "expected_step1.pt", weights_only=True)
    for key, value in model.state_dict().items():
        assert torch.equal(value, expected[key])

    save_checkpoint(run_dir, 2, model=model, optimizer=optimizer)
    assert not leftover.exists()
    assert step_dirs(run_dir) == ["step_000001", "step_000002"]
    assert latest_checkpoint(run_dir).name == "step_000002"


def test_marker_to_missing_dir_falls_back_with_warning(tmp_path, caplog):
    assert latest_checkpoint(tmp_path) is None
    for step in (1, 2):
        save_checkpoint(tmp_path, step, model=small_model())
    root = tmp_path / "checkpoints"
    (root / ".tmp_step_000003").mkdir()  # a crashed write is never a candidate
    (root / ".tmp_step_000003" / "trainer_state.json").write_text('{"step": 3}')
    for path in (root / "step_000002").iterdir():
        path.unlink()
    (root / "step_000002").rmdir()
    with caplog.at_level(logging.WARNING, logger="ragrl"):
        assert latest_checkpoint(tmp_path) == root / "step_000001"
    assert "step_000002" in caplog.text
    (root / "latest").write_text("../../etc\n")  # garbage marker: also falls back
    assert latest_checkpoint(tmp_path) == root / "step_000001"


def test_corrupt_or_mismatched_files_raise_errors_naming_the_file(tmp_path):
    model = small_model()
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(3, 4)).sum().backward()
    optimizer.step()
    ckpt = save_checkpoint(tmp_path, 1, model=model, optimizer=optimizer)

    data = (ckpt / "optimizer.pt").read_bytes()
    (ckpt / "optimizer.pt").write_bytes(data[: len(data) // 2])
    with pytest.raises(RagrlError, match="optimizer.pt"):
        load_checkpoint(ckpt, model=small_model(), optimizer=optimizer)
    (ckpt / "rng.pt").unlink()
    with pytest.raises(RagrlError, match="rng.pt is missing"):
        load_checkpoint(ckpt, model=small_model())
    with pytest.raises(RagrlError, match="model.safetensors"):
        load_checkpoint(ckpt, model=torch.nn.Linear(5, 2), restore_rng=False)  # wrong shape
    (ckpt / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(RagrlError, match="model.safetensors"):
        load_checkpoint(ckpt, model=small_model(), restore_rng=False)
    (ckpt / "trainer_state.json").write_text("{trunc")
    with pytest.raises(RagrlError, match="trainer_state.json"):
        load_checkpoint(ckpt, model=small_model(), restore_rng=False)
    with pytest.raises(RagrlError, match="not JSON-serialisable"):
        save_checkpoint(tmp_path, 2, model=model, extra={"cfg": object()})
    with pytest.raises(RagrlError, match="does not exist"):
        load_checkpoint(tmp_path / "nope", model=model)


# ---------------------------------------------------------------- damaged checkpoints (manifest)

def test_manifest_lists_every_file_with_its_size_and_sha256(tmp_path):
    base = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    model = get_peft_model(base, LoraConfig(r=2, target_modules=["0", "2"]))
    model.add_adapter("other", LoraConfig(r=2, target_modules=["0"]))  # saved in a subdir
    optimizer, scheduler = make_optim([p for p in model.parameters() if p.requires_grad])
    ckpt = save_checkpoint(tmp_path, 7, model=model, optimizer=optimizer, scheduler=scheduler,
                           extra_modules={"value_head": torch.nn.Linear(8, 1)})
    manifest = json.loads((ckpt / "manifest.json").read_text())
    on_disk = {p.relative_to(ckpt).as_posix() for p in ckpt.rglob("*") if p.is_file()}
    assert "other/adapter_model.safetensors" in on_disk
    assert manifest["format"] == 1 and manifest["step"] == 7
    assert set(manifest["files"]) == on_disk - {"manifest.json"}
    for rel, entry in manifest["files"].items():
        data = (ckpt / rel).read_bytes()
        assert entry == {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}, rel
    assert verify_checkpoint(ckpt) is None


def two_checkpoints(run_dir):
    """Checkpoints at steps 10 and 20 of a small model with optimizer and scheduler, different
    weights in each. Returns the step-10 weights."""
    torch.manual_seed(0)
    model = small_model()
    optimizer, scheduler = make_optim(model.parameters())
    weights = {}
    for step in (10, 20):
        model(torch.randn(3, 4)).pow(2).sum().backward()
        optimizer.step()
        scheduler.step()
        save_checkpoint(run_dir, step, model=model, optimizer=optimizer, scheduler=scheduler,
                        extra={"data_pos": step})
        weights[step] = snapshot(model)
    assert not all(torch.equal(a, b) for a, b in zip(weights[10], weights[20]))
    return weights[10]


def ckpt_dir(run_dir, step):
    return run_dir / "checkpoints" / f"step_{step:06d}"


def test_truncated_file_falls_back_to_the_previous_checkpoint_with_a_warning(tmp_path, caplog):
    two_checkpoints(tmp_path)
    path = ckpt_dir(tmp_path, 20) / "optimizer.pt"
    size = path.stat().st_size
    path.write_bytes(path.read_bytes()[:100])
    assert verify_checkpoint(ckpt_dir(tmp_path, 20)) == (
        f"optimizer.pt is 100 bytes, the manifest says {size} (truncated)")
    with caplog.at_level(logging.WARNING, logger="ragrl"):
        assert latest_checkpoint(tmp_path) == ckpt_dir(tmp_path, 10)
    [warning] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "step_000020 is damaged (optimizer.pt is 100 bytes" in warning
    assert "(truncated)" in warning and "resuming from step_000010 instead" in warning


def test_flipped_byte_is_a_checksum_mismatch_and_falls_back(tmp_path, caplog):
    two_checkpoints(tmp_path)
    path = ckpt_dir(tmp_path, 20) / "model.safetensors"
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01  # the last byte of a weight: same size, still a loadable file
    path.write_bytes(bytes(data))
    load_checkpoint(ckpt_dir(tmp_path, 20), model=small_model(), restore_rng=False)  # loads "fine"
    assert verify_checkpoint(ckpt_dir(tmp_path, 20)) == (
        "model.safetensors does not match its checksum (corrupted)")
    with caplog.at_level(logging.WARNING, logger="ragrl"):
        assert latest_checkpoint(tmp_path) == ckpt_dir(tmp_path, 10)
    assert "model.safetensors does not match its checksum (corrupted)" in caplog.text
    assert "resuming from step_000010" in caplog.text


def test_deleted_file_falls_back_and_a_lone_damaged_checkpoint_is_never_skipped(tmp_path, caplog):
    two_checkpoints(tmp_path)
    (ckpt_dir(tmp_path, 20) / "rng.pt").unlink()
    assert verify_checkpoint(ckpt_dir(tmp_path, 20)) == "rng.pt is missing"
    with caplog.at_level(logging.WARNING, logger="ragrl"):
        assert latest_checkpoint(tmp_path) == ckpt_dir(tmp_path, 10)
    assert "step_000020 is damaged (rng.pt is missing)" in caplog.text

    # Without its trainer_state.json a step dir used to be ignored, so a run whose only
    # checkpoint lost it started over from nothing; now it is reported as damaged.
    solo = tmp_path / "solo"
    save_checkpoint(solo, 5, model=small_model())
    (ckpt_dir(solo, 5) / "trainer_state.json").unlink()
    with pytest.raises(RagrlError, match=r"step_000005 is damaged \(trainer_state.json is missing"):
        latest_checkpoint(solo)


def test_every_checkpoint_damaged_raises_naming_each(tmp_path):
    two_checkpoints(tmp_path)
    (ckpt_dir(tmp_path, 20) / "scheduler.pt").unlink()
    (ckpt_dir(tmp_path, 10) / "manifest.json").write_text("{not json")
    with pytest.raises(RagrlError) as err:
        latest_checkpoint(tmp_path)
    msg = str(err.value)
    assert "no intact checkpoint" in msg
    assert "step_000020 is damaged (scheduler.pt is missing)" in msg
    assert "step_000010 is damaged (manifest.json is unreadable:" in msg
    assert latest_checkpoint(tmp_path / "other_run") is None  # no checkpoints at all: still None


def test_checkpoint_without_manifest_still_loads_with_one_warning(tmp_path, caplog):
    two_checkpoints(tmp_path)
    for step in (10, 20):  # as written by a ragrl from before manifests
        (ckpt_dir(tmp_path, step) / "manifest.json").unlink()
    assert verify_checkpoint(ckpt_dir(tmp_path, 20)) is None
    with caplog.at_level(logging.WARNING, logger="ragrl"):
        ckpt = latest_checkpoint(tmp_path)
    assert ckpt == ckpt_dir(tmp_path, 20)
    [warning] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "step_000020 has no manifest.json" in warning and "cannot be verified" in warning
    assert load_checkpoint(ckpt, model=small_model())["data_pos"] == 20


def test_load_after_fallback_restores_the_older_step_exactly(tmp_path):
    step10_weights = two_checkpoints(tmp_path)
    path = ckpt_dir(tmp_path, 20) / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-8])
    model = small_model()
    optimizer, scheduler = make_optim(model.parameters())
    state = load_checkpoint(latest_checkpoint(tmp_path), model=model, optimizer=optimizer,
                            scheduler=scheduler)
    assert state == {"step": 10, "data_pos": 10}
    assert scheduler.last_epoch == 1
    for got, want in zip(snapshot(model), step10_weights, strict=True):
        assert torch.equal(got, want)


def test_pruning_never_deletes_the_only_intact_older_checkpoint(tmp_path, caplog):
    two_checkpoints(tmp_path)  # keep_last=3: nothing pruned yet
    path = ckpt_dir(tmp_path, 20) / "optimizer.pt"
    path.write_bytes(path.read_bytes()[:50])
    with caplog.at_level(logging.WARNING, logger="ragrl"):
        save_checkpoint(tmp_path, 30, model=small_model(), keep_last=2)
    # Counting dirs, step 10 would go; but step 20 is damaged, so 10 is the intact fallback.
    assert step_dirs(tmp_path) == ["step_000010", "step_000020", "step_000030"]
    assert "step_000020 is damaged" in caplog.text
    (ckpt_dir(tmp_path, 30) / "rng.pt").unlink()
    assert latest_checkpoint(tmp_path) == ckpt_dir(tmp_path, 10)
    # With enough intact ones again, pruning removes the old and damaged dirs as before.
    for step in (40, 50):
        save_checkpoint(tmp_path, step, model=small_model(), keep_last=2)
    assert step_dirs(tmp_path) == ["step_000040", "step_000050"]


@pytest.fixture
def small_fs(tmp_path):
    """A real 512 KiB tmpfs, where this machine lets the test mount one (root in a container that
    allows it); skipped elsewhere: the trainer-level test (test_trainer_resume) injects the same
    ENOSPC at the file layer and runs everywhere."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(mnt)], capture_output=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {res.stderr.decode(errors='replace').strip()}")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_disk_full_mid_checkpoint_keeps_the_previous_one_and_names_path_and_free_space(small_fs):
    from ragrl.errors import RunWriteFailed

    small = torch.nn.Linear(8, 8)               # ~2 KB of weights: fits
    save_checkpoint(small_fs, 1, model=small)
    big = torch.nn.Linear(8, 8)
    big.register_buffer("filler", torch.zeros(256, 1024))   # 1 MiB: does not
    with pytest.raises(RunWriteFailed) as err:
        save_checkpoint(small_fs, 2, model=big)
    msg = str(err.value)
    assert "could not write checkpoint step 2 to" in msg and ".tmp_step_000002" in msg
    assert "No space left on device" in msg and "MiB free on that file system" in msg
    assert f"the previous intact checkpoint is {small_fs / 'checkpoints' / 'step_000001'}" in msg
    assert err.value.exit_code == 74
    ckpts = small_fs / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir()) == ["latest", "step_000001"]   # no half-written copy
    assert latest_checkpoint(small_fs).name == "step_000001" and verify_checkpoint(ckpts / "step_000001") is None
    restored = torch.nn.Linear(8, 8)
    load_checkpoint(ckpts / "step_000001", model=restored)
    assert torch.equal(restored.weight, small.weight)
    save_checkpoint(small_fs, 2, model=small)   # with room again, the next save goes through
    assert latest_checkpoint(small_fs).name == "step_000002"


def test_a_failed_write_names_the_newest_intact_checkpoint_not_a_damaged_newer_one(tmp_path, monkeypatch):
    """Found by benchmarks/soak.py: a resume had fallen back past a damaged step_000002, whose dir
    stays; step 2's new write then failed, and the message called the damaged dir intact."""
    import errno

    from ragrl.errors import RunWriteFailed
    from ragrl.train import checkpoint

    model = torch.nn.Linear(4, 4)
    save_checkpoint(tmp_path, 1, model=model)
    save_checkpoint(tmp_path, 2, model=model)
    ckpts = tmp_path / "checkpoints"
    weights = next(p for p in (ckpts / "step_000002").iterdir() if p.suffix == ".safetensors")
    weights.write_bytes(weights.read_bytes()[:-5])

    def full(*a, **kw):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(checkpoint, "_write_files", full)
    with pytest.raises(RunWriteFailed) as err:
        save_checkpoint(tmp_path, 2, model=model)
    assert f"the previous intact checkpoint is {ckpts / 'step_000001'}" in str(err.value)
    for p in ckpts.glob("step_*"):
        shutil.rmtree(p)
    with pytest.raises(RunWriteFailed, match="no earlier intact checkpoint exists"):
        save_checkpoint(tmp_path, 3, model=model)
