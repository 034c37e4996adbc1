"""The README's Python section runs as written (the public API it shows is ragrl.api): every
```python block, in a fresh interpreter, in an empty folder, with the real SmolLM2 and the bundled
demo data."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def python_blocks(markdown: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", markdown, flags=re.S | re.M)


def test_python_blocks_are_found():
    blocks = python_blocks((ROOT / "README.md").read_text())
    assert len(blocks) == 1 and "from ragrl.api import" in blocks[0]


@pytest.mark.slow
def test_the_readmes_python_example_runs_as_written(tmp_path, smollm2_path):
    (block,) = python_blocks((ROOT / "README.md").read_text())
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": ""}
    out = subprocess.run([sys.executable, "-c", block], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    systems = [line.split()[0] for line in lines if " F1 " in line]
    assert set(systems) == {"direct", "naive_rag", "python_demo"} and len(systems) == 4   # and python_demo (start)
    assert any(line.startswith("vs naive_rag: {'diff'") for line in lines)
    steps = [line for line in lines if re.match(r"^[01] \d", line)]
    assert [s.split()[0] for s in steps] == ["0", "1"]                       # two RL steps, one metrics row each
    run = tmp_path / "runs" / "python_demo"
    assert "short_answer: 0.1" in (run / "config.yaml").read_text()        # the snippet's reward was trained on
    table = json.loads((tmp_path / "runs" / "python_demo_compare" / "compare.json").read_text())
    assert table["rows"]["naive_rag"]["n"] == 10 and "python_demo" in table["vs_baseline"]
