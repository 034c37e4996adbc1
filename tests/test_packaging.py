"""`pip install .` (not editable) keeps every recipe, and `pip install ./datakit` brings the data kit:
both wheels built from the checkout, installed in a fresh venv that cannot see the checkout, list and
check a recipe and verify the kit from another directory; ragrl's own wheel stays small."""
from __future__ import annotations

import os
import site
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(cmd, **kw) -> subprocess.CompletedProcess:
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, **kw)
    assert out.returncode == 0, f"{cmd} failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out


def test_a_wheel_installed_in_a_fresh_venv_finds_its_recipes_and_the_kit(tmp_path):
    wheels = tmp_path / "wheels"
    for project in (ROOT, ROOT / "datakit"):
        run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(wheels),
             str(project)])
    wheel = next(wheels.glob("ragrl-0*.whl"))
    kit_wheel = next(wheels.glob("ragrl_data-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert "ragrl/recipes/search_r1_grpo.yaml" in names and "ragrl/recipes/r1_searcher_stage1.yaml" in names
    assert not any("wiki_passages" in n for n in names) and wheel.stat().st_size < 5e6   # the kit is not in it
    kit_names = zipfile.ZipFile(kit_wheel).namelist()
    assert {"ragrl_data/manifest.json", "ragrl_data/corpus/wiki_passages.jsonl.gz",
            "ragrl_data/embeddings/wiki_passages.all-minilm-l6-v2.fp16.npy"} <= set(kit_names)

    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    # The fresh venv sees this environment's third-party packages (torch, transformers, ...) through
    # a path file, but not its editable install of the checkout: a .pth file inside a directory
    # added by another .pth is not processed, so `ragrl` can come only from the wheel.
    purelib = Path(sysconfig.get_paths(vars={"base": str(venv), "platbase": str(venv)})["purelib"])
    purelib.mkdir(parents=True, exist_ok=True)
    (purelib / "parent_env.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    python = venv / "bin" / "python"
    run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index", "--ignore-installed", "-q", str(wheel),
         str(kit_wheel)])

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {**os.environ, "PYTHONPATH": "", "OMP_NUM_THREADS": "1"}   # the session's RAGRL_HOME: converted model, cached index
    env.pop("RAGRL_DATA", None)
    where = run([str(python), "-c", "import ragrl, ragrl.train.recipe as r; print(ragrl.__file__); "
                 "print(r.resolve_recipe('search_r1_grpo'))"], cwd=elsewhere, env=env).stdout.split()
    assert all(str(purelib) in w for w in where), where   # the wheel's copy, not the checkout's
    ragrl = venv / "bin" / "ragrl"
    listing = run([str(ragrl), "train", "--list"], cwd=elsewhere, env=env).stdout
    for recipe in ("search_r1_grpo", "r1_searcher_stage2", "rag_r1_ppo", "smartrag_ppo", "mmoa_mappo", "harr_grpo"):
        assert recipe in listing
    check = run([str(ragrl), "train", "search_r1_grpo", "--variant", "tiny", "--check"], cwd=elsewhere, env=env).stdout
    assert "nothing was trained" in check
    assert not (elsewhere / "runs").exists()
    kit = run([str(ragrl), "data"], cwd=elsewhere, env=env).stdout.splitlines()
    assert str(purelib / "ragrl_data") in kit[0] and kit[-1].startswith("18 of 18 files verified")
