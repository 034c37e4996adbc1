"""tests/ mirrors src/ragrl: each folder of tests/ is a package of ragrl, and each test file is named
after the module (or subpackage) of that package it tests: test_<module>.py, or
test_<module>_<aspect>.py for a second file on one module."""
from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parent
SRC = TESTS.parent / "src" / "ragrl"
# Folders of tests/ that test what is not in the package: the experiments' own code, the scripts'
# (scripts/device: dry runs of the GPU runs), snapshots.
OUTSIDE = {"benchmarks", "experiments", "scripts", "snapshots"}
# Tests of the whole package rather than one module.
WHOLE = {"test_layering.py", "test_layout.py", "test_packaging.py", "test_fresh_clone.py"}


def modules(folder: Path) -> set[str]:
    return {p.stem for p in folder.glob("*.py") if p.stem != "__init__"} | \
           {p.name for p in folder.iterdir() if p.is_dir() and (p / "__init__.py").exists()}


def misplaced() -> list[str]:
    bad = []
    for test in sorted(TESTS.rglob("test_*.py")):
        rel = test.relative_to(TESTS)
        if rel.parts[0] in OUTSIDE or (len(rel.parts) == 1 and rel.name in WHOLE):
            continue
        folder = SRC.joinpath(*rel.parts[:-1])
        if not folder.is_dir():
            bad.append(f"{rel}: src/ragrl/{'/'.join(rel.parts[:-1])} is not a package")
            continue
        stem = rel.stem.removeprefix("test_")
        if not any(stem == m or stem.startswith(m + "_") for m in modules(folder) | {folder.name}):
            bad.append(f"{rel}: no module {stem!r} in src/ragrl/{'/'.join(rel.parts[:-1]) or '.'}")
    return bad


def test_tests_mirror_the_package():
    assert not misplaced(), "test files that do not mirror src/ragrl:\n" + "\n".join(misplaced())


def test_every_package_has_a_test_folder():
    packages = {p.name for p in SRC.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    missing = sorted(p for p in packages if not (TESTS / p).is_dir() and p not in {"recipes", "data"})
    assert not missing, f"packages with no tests/ folder: {missing}"


def test_every_folder_of_code_is_a_package():
    """A folder of modules without __init__.py is a namespace package: it imports, but pytest's
    doctest collection then puts the folder itself on sys.path, where engines/vllm.py shadows vllm."""
    loose = sorted(str(d.relative_to(SRC)) for d in SRC.rglob("*") if d.is_dir() and d.name != "__pycache__"
                   and any(d.glob("*.py")) and not (d / "__init__.py").exists())
    assert not loose, f"folders of modules with no __init__.py: {loose}"
