"""The data kit is part of the project: the installed ragrl-data package verifies against its
manifest, the repository's datakit/ folder lists every file it ships, a damaged or missing file is
named, $RAGRL_DATA overrides the package, and a machine with neither says how to get one."""
from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest

import ragrl.paths
from ragrl.errors import RagrlError
from ragrl.kit import inspect_kit, verify_kit
from ragrl.paths import data_kit, resolve_kit

ROOT = Path(__file__).resolve().parents[1]
DATAKIT = ROOT / "datakit" / "src" / "ragrl_data"


def small_kit(folder: Path) -> Path:
    """A kit of the same layout: two of the real kit's small files and a manifest for them."""
    for rel in ("eval/musique_dev.jsonl.gz", "train/popqa_pool.jsonl.gz"):
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(DATAKIT / rel, folder / rel)
    real = json.loads((DATAKIT / "manifest.json").read_text())
    files = {rel: real["files"][rel] for rel in ("eval/musique_dev.jsonl.gz", "train/popqa_pool.jsonl.gz")}
    (folder / "manifest.json").write_text(json.dumps({"files": files, "licence": "test"}))
    return folder


def test_the_installed_kit_is_the_repositorys_and_verifies(monkeypatch):
    monkeypatch.delenv("RAGRL_DATA", raising=False)
    report = verify_kit()
    assert report.origin.startswith("ragrl-data ")
    by_path = {f.path: f for f in report.files}
    assert all(f.status == "ok" for f in report.files), [(f.path, f.status) for f in report.files]
    assert by_path["corpus/wiki_passages.jsonl.gz"].rows == 51185
    assert by_path["embeddings/wiki_passages.all-minilm-l6-v2.fp16.npy"].rows == 51185
    assert by_path["eval/hotpotqa_dev.jsonl.gz"].rows == 358
    for f in report.files:   # every data file carries its licence, and every question file its sources
        assert f.licence, f.path
        if f.path.startswith(("eval/", "train/", "corpus/")):
            assert f.sources and all(any(s["key"] == k for s in report.sources) for k in f.sources), f.path
    # the installed copy is byte for byte the repository's folder
    assert inspect_kit(DATAKIT).intact and {f.path for f in inspect_kit(DATAKIT).files} == set(by_path)


def test_the_manifest_lists_every_file_the_package_ships():
    """A file added to datakit/ without rebuilding the manifest (datakit/scripts/build_manifest.py) fails here."""
    statuses = {f.path: f.status for f in inspect_kit(DATAKIT).files}
    assert set(statuses.values()) == {"ok"}, statuses
    package_data = (ROOT / "datakit" / "pyproject.toml").read_text()
    for top in {p.split("/")[0] for p in statuses if "/" in p}:
        assert f'"{top}/' in package_data, f"datakit/pyproject.toml does not ship {top}/"


def test_a_changed_or_missing_file_is_named(tmp_path):
    kit = small_kit(tmp_path / "kit")
    assert verify_kit(kit).intact
    path = kit / "eval" / "musique_dev.jsonl.gz"
    data = bytearray(path.read_bytes())
    data[100] ^= 0xFF
    path.write_bytes(bytes(data))
    (kit / "train" / "popqa_pool.jsonl.gz").unlink()
    with gzip.open(kit / "train" / "extra.jsonl.gz", "wt") as handle:
        handle.write('{"question": "q", "answers": ["a"]}\n')
    statuses = {f.path: f.status for f in inspect_kit(kit).files}
    assert statuses == {"eval/musique_dev.jsonl.gz": "changed", "train/popqa_pool.jsonl.gz": "missing",
                        "train/extra.jsonl.gz": "unlisted"}
    with pytest.raises(RagrlError, match=r"musique_dev.jsonl.gz \(changed\).*popqa_pool.jsonl.gz \(missing\)"):
        verify_kit(kit)


def test_a_folder_without_a_manifest_or_with_a_broken_one_is_refused(tmp_path):
    with pytest.raises(RagrlError, match="no manifest.json"):
        inspect_kit(tmp_path)
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(RagrlError, match="not a kit manifest"):
        inspect_kit(tmp_path)


def test_ragrl_data_overrides_the_package(tmp_path, monkeypatch):
    kit = small_kit(tmp_path / "kit")
    monkeypatch.setenv("RAGRL_DATA", str(kit))
    assert data_kit() == kit
    assert resolve_kit("kit:eval/musique_dev.jsonl.gz") == kit / "eval" / "musique_dev.jsonl.gz"
    with pytest.raises(RagrlError, match="no such file in the data kit"):
        resolve_kit("kit:corpus/wiki_passages.jsonl.gz")   # the small kit has no corpus: named, not the package's
    assert inspect_kit().origin == "$RAGRL_DATA"
    monkeypatch.setenv("RAGRL_DATA", str(tmp_path / "nowhere"))
    with pytest.raises(RagrlError, match="is not a directory"):
        data_kit()


def test_without_the_package_the_error_says_how_to_install_it(monkeypatch):
    monkeypatch.delenv("RAGRL_DATA", raising=False)
    monkeypatch.setattr(ragrl.paths, "ragrl_data", None)
    with pytest.raises(RagrlError, match=r"pip install ./datakit.*RAGRL_DATA"):
        resolve_kit("kit:eval/hotpotqa_dev.jsonl.gz")
