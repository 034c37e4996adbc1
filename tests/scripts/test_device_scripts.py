"""The GPU run of issue #53 (scripts/device/search_r1_gpu.sh), dry-run on the CPU: the same script, the
same recipe and overrides, with a tiny model, a tiny batch and one step, so that a lent GPU finds it
ready (a wrong --set key, a renamed metric or a broken summary fails here, not in device time)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import yaml

from ragrl.datasets import load_questions
from ragrl.paths import DEMO_CORPUS
from tests.train.test_trainer_resume import write_jsonl

ROOT = Path(__file__).resolve().parents[2]


def test_search_r1_gpu_script_dry_run(tiny_model_dir, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    train = [q for q in load_questions("demo-train") if q.get("gold_passage_ids")][:60]
    write_jsonl(tmp_path / "train.jsonl", train)
    write_jsonl(tmp_path / "dev.jsonl", load_questions("demo-eval")[:3])
    env = {**os.environ, "DRY": "1", "MODEL": str(tiny_model_dir), "OUT": str(out), "PY": sys.executable,
           "RUN": str(tmp_path / "run"), "STEPS": "1", "QPS": "2", "N": "2", "EVAL_N": "3", "EVAL_EVERY": "1",
           "RAGRL_HOME": str(tmp_path / "home"), "PYTHONPATH": str(ROOT / "src")}
    sets = [f"data.train={tmp_path / 'train.jsonl'}", f"data.eval={tmp_path / 'dev.jsonl'}", f"data.corpus={DEMO_CORPUS}",
            "rollout.max_turn_tokens=8", "rollout.max_obs_tokens=32", "rollout.max_response_tokens=160",
            "algo.drop_flat_groups=false"]   # 2 x 2 tiny-model samples are often all flat: the update must run
    cmd = ["bash", str(ROOT / "scripts/device/search_r1_gpu.sh")] + [a for s in sets for a in ("--set", s)]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:] + (out / "train.log").read_text()[-3000:]
    cfg = yaml.safe_load((out / "config.yaml").read_text())
    # the variant's own settings with the paper-like batch's overrides (here shrunk)
    assert cfg["rollout"]["first_action"] == "search" and cfg["rollout"]["answer_by"] == "reader"
    assert cfg["questions_per_step"] == 2 and cfg["rollout"]["n"] == 2
    assert cfg["algo"]["minibatch_size"] == 2 and cfg["algo"]["micro_batch_size"] == 2
    assert cfg["reward"] == {"f1": 0.0, "answer_rank": 1.0, "search_gain": 1.0, "gold_recall": 1.0}
    curve = json.loads((out / "curve.json").read_text())
    assert [s["step"] for s in curve["steps"]] == [0]
    assert curve["steps"][0]["tokens_per_s"] > 0 and curve["steps"][0]["time/update_s"] > 0
    # the start and the step evaluated, with the search gain beside F1
    assert [e["trained_steps"] for e in curve["evals"]] == [0, 1], curve["evals"]
    for e in curve["evals"]:
        assert {"f1", "searches", "format_error_rate", "search_gain", "answer_shown"} <= set(e)
    with tarfile.open(out / "adapter.tgz") as tar:
        assert "final_adapter/adapter_config.json" in tar.getnames()
