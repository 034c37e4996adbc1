"""experiments/mmoa/mmoa_selector_vs_retriever.py on hand-made cached results over real pool-dev questions,
and the doctests of the MMOA experiment helpers (experiments/ is not on pytest's doctest path)."""
import doctest
import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from ragrl.eval.cache import Cache, adapter_digest

REPO = Path(__file__).resolve().parents[2]   # the experiment scripts run from here, as modules

# The gold passages of the first three pool-dev questions (src/ragrl/data/pool_dev.jsonl.gz).
A1, A2, B1, C1 = "p014321", "p014323", "p002478", "p011090"


@pytest.mark.parametrize("module", ["mmoa_selector_vs_retriever", "mmoa_selector_logits", "mmoa_selector_sampling"])
def test_experiment_helpers_pass_their_doctests(module):
    result = doctest.testmod(importlib.import_module(f"experiments.mmoa.{module}"))
    assert result.attempted > 0 and result.failed == 0


def _row(retrieved, selected, gold_hits=None):
    hits = len(set(selected) & {A1, A2, B1, C1}) if gold_hits is None else gold_hits
    return {"f1": 0.0, "retrieved": retrieved, "selected": selected,
            "selector_precision": hits / len(selected) if selected else 0.0, "selector_recall": hits / 2}


def _run(tmp_path, sft_rows, run_rows):
    sft, run = tmp_path / "sft", tmp_path / "run"
    for d in (sft, run):
        d.mkdir()
        (d / "adapter_model.safetensors").write_bytes(d.name.encode())
    cache = Cache(tmp_path / "part.cache" / "pool-dev", 3, {"temperature": 0.0, "dtype": "torch.bfloat16"})
    cache.put("SFT", adapter_digest(str(sft)), sft_rows)
    cache.put("R", adapter_digest(str(run)), run_rows)
    return subprocess.run([sys.executable, "-m", "experiments.mmoa.mmoa_selector_vs_retriever",
                           "--part", str(tmp_path / "part"), "--sft", str(sft), "--system", f"R={run}",
                           "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=120, cwd=REPO)


def test_prefix_following_first_pick_own_top1_and_the_retriever_baselines(tmp_path):
    sft_rows = [_row([A1, "x", A2], [A1]), _row(["x", B1, "y"], ["x"]), _row(["y", "z", C1], ["y", "z"])]
    run_rows = [_row([A1, "x", A2], [A1, A2]), _row([B1, "x"], [B1]), _row(["y", C1], [C1])]
    res = _run(tmp_path, sft_rows, run_rows)
    assert res.returncode == 0, res.stderr
    g = json.loads((tmp_path / "out.json").read_text())["groups"]["pool-dev"]
    sft, run = g["systems"]["SFT"], g["systems"]["R"]
    assert (sft["follows_order"], sft["first_gold"], sft["own_top1_f1"]) == pytest.approx((100, 100 / 3, 200 / 9))
    assert (run["follows_order"], run["first_gold"], run["kept"]) == pytest.approx((100 / 3, 100, 4 / 3))
    assert run["own_top1_f1"] == pytest.approx(400 / 9) and run["selector_f1"][0] == pytest.approx(700 / 9)
    assert g["systems"]["retriever top-1 (SFT's candidates)"]["selector_f1"][0] == pytest.approx(200 / 9)
    assert g["systems"]["retriever top-2 (SFT's candidates)"]["selector_f1"][0] == pytest.approx(100 / 3)
    assert g["systems"]["ceiling: the gold among SFT's candidates"]["selector_f1"][0] == pytest.approx(700 / 9)
    assert g["vs_own_top1"]["R"]["diff"] == pytest.approx(100 / 3)   # 77.8 - 44.4 points (a paired_record)
    assert g["vs_own_top1"]["SFT"]["diff"] == pytest.approx(0.0)


def test_cached_selections_that_disagree_with_the_gold_passages_are_refused(tmp_path):
    """A cache written for other questions (its stored precision not what these gold ids give) must
    not be scored against these."""
    rows = [_row([A1, "x"], [A1]), _row(["x", B1], ["x"], gold_hits=1), _row(["y", C1], ["y"])]
    res = _run(tmp_path, rows, rows)
    assert res.returncode != 0 and "do not match the questions' gold passages" in res.stderr
    assert not (tmp_path / "out.json").exists()
