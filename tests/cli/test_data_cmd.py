"""`ragrl data`: the report a user reads (files, rows, licences, sources) and its exit code."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

DATAKIT = Path(__file__).resolve().parents[2] / "datakit" / "src" / "ragrl_data"
RAGRL = Path(sys.executable).parent / "ragrl"


def ragrl(*args, env=None):
    return subprocess.run([str(RAGRL), *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})


def test_ragrl_data_reports_and_verifies_the_installed_kit():
    env = {k: v for k, v in os.environ.items() if k != "RAGRL_DATA"}
    out = subprocess.run([str(RAGRL), "data"], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert "(ragrl-data " in lines[0] and lines[1].startswith("licence: CC BY-SA 4.0")
    corpus = next(line for line in lines if "corpus/wiki_passages.jsonl.gz" in line)
    assert corpus.startswith("ok") and "51,185 rows" in corpus and "CC BY-SA" in corpus
    assert any("from OpenSPG/KAG" in line for line in lines)                 # musique_dev's source repository
    assert lines[-1].startswith("18 of 18 files verified by sha256")

    report = json.loads(ragrl("data", "--json", "--sources").stdout)
    assert report["intact"] and len(report["sources"]) == 64
    assert {f["path"] for f in report["files"]} >= {"eval/musique_dev.jsonl.gz", "train/musique_train.jsonl.gz"}


def test_ragrl_data_names_a_damaged_file_and_exits_non_zero(tmp_path):
    kit = tmp_path / "kit"
    (kit / "eval").mkdir(parents=True)
    shutil.copy(DATAKIT / "eval" / "musique_dev.jsonl.gz", kit / "eval")
    entry = json.loads((DATAKIT / "manifest.json").read_text())["files"]["eval/musique_dev.jsonl.gz"]
    (kit / "manifest.json").write_text(json.dumps({"files": {"eval/musique_dev.jsonl.gz": entry}}))
    assert ragrl("data", env={"RAGRL_DATA": str(kit)}).returncode == 0
    (kit / "eval" / "musique_dev.jsonl.gz").write_bytes(b"tampered")
    out = ragrl("data", env={"RAGRL_DATA": str(kit)})
    assert out.returncode == 2
    assert out.stdout.splitlines()[1].startswith("changed  eval/musique_dev.jsonl.gz")
    assert "does not match its manifest: eval/musique_dev.jsonl.gz (changed)" in out.stderr
