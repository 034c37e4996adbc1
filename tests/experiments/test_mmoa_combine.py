"""experiments/mmoa/mmoa_combine.py: results of disjoint question ranges pooled into one paired test,
systems found by their adapter's bytes, overlapping ranges refused."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from ragrl.eval.cache import Cache, adapter_digest

REPO = Path(__file__).resolve().parents[2]   # the experiment scripts run from here, as modules


def _adapter(root: Path, name: str) -> Path:
    d = root / name
    d.mkdir()
    (d / "adapter_model.safetensors").write_bytes(name.encode())   # the digest reads the bytes
    return d


def _part(root: Path, skip: int, per_system: dict, names: dict, set_name: str = "hotpotqa_dev",
          dtype: str = "torch.bfloat16") -> Path:
    """An mmoa_eval --out whose cache holds one range of a set: {adapter dir: [(f1, P, R), ...]}."""
    n = len(next(iter(per_system.values())))
    cache = Cache(root.with_suffix(".cache") / set_name, n,
                  {"temperature": 0.0, "dtype": dtype, **({"skip": skip} if skip else {})})
    for adapter, rows in per_system.items():
        cache.put(names[adapter], adapter_digest(str(adapter)),
                  [{"em": float(f == 1.0), "f1": f, "selector_precision": p, "selector_recall": r}
                   for f, p, r in rows])
    return root


def _combine(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "experiments.mmoa.mmoa_combine", *map(str, args)],
                          capture_output=True, text=True, timeout=120, cwd=REPO)


def test_two_ranges_pool_into_one_paired_test_matching_systems_by_adapter_bytes(tmp_path):
    sft, run = _adapter(tmp_path, "sft"), _adapter(tmp_path, "run")
    first = _part(tmp_path / "first", 0, {sft: [(0.0, 1, 0.5), (0.5, 0, 0)], run: [(1.0, 1, 0.5), (0.5, 0, 0)]},
                  {sft: "SFT", run: "MAPPO"})
    # the second range names the run differently: found by its bytes, not its name
    second = _part(tmp_path / "second", 2, {sft: [(0.2, 1, 1), (0.0, 0, 0), (0.4, 1, 0.5)],
                                            run: [(0.2, 1, 1), (0.3, 0, 0), (0.4, 0, 0)]},
                   {sft: "SFT", run: "C1: renamed"})
    _part(first, 0, {sft: [(0.1, 0, 0)], run: [(0.6, 1, 1)]}, {sft: "SFT", run: "MAPPO"}, "musique_dev")
    res = _combine("--part", first, "--part", second, "--sft", sft, "--system", f"R={run}", "--out", tmp_path / "out")
    assert res.returncode == 0, res.stderr
    out = json.loads((tmp_path / "out.json").read_text())
    assert out["spans"] == {"hotpotqa_dev": [[1, 2], [3, 5]], "musique_dev": [[1, 1]]}
    hotpot = out["groups"]["hotpotqa_dev"]
    assert hotpot["n"] == 5
    # answer F1 differences per question: +1.0, 0, 0, +0.3, 0 -> mean 0.26
    assert hotpot["paired"]["R"]["f1"]["diff"] == pytest.approx(26.0)   # a paired_record, in points
    # selector F1 per question, SFT: 2/3, 0, 1, 0, 2/3; R: 2/3, 0, 1, 0, 0 -> mean difference -2/15
    assert hotpot["paired"]["R"]["selector_f1"]["diff"] == pytest.approx(-200 / 15)
    pooled = out["groups"]["pooled"]   # both sets: the MuSiQue question adds +0.5 F1 and +1 selector F1
    assert pooled["n"] == 6
    assert pooled["paired"]["R"]["f1"]["diff"] == pytest.approx(100 * (1.3 + 0.5) / 6)
    assert pooled["paired"]["R"]["selector_f1"]["diff"] == pytest.approx(100 * (-2 / 3 + 1) / 6)
    assert "| R | +26.0 [" in (tmp_path / "out.md").read_text()
    # levels, the table: R's pooled EM (exact F1 1.0 on 1 of 6), precision (1, 0, 1, 0, 0, 1 -> 1/2)
    # and recall (0.5, 0, 1, 0, 0, 1 -> 5/12), in percent, each with a CI
    levels = pooled["systems"]["R"]
    assert levels["em"][0] == pytest.approx(100 / 6)
    assert levels["selector_precision"][0] == pytest.approx(50.0)
    assert levels["selector_recall"][0] == pytest.approx(100 * 5 / 12)
    assert "| system | EM | answer F1 | selector P | selector R | selector F1 |" in (tmp_path / "out.md").read_text()


def test_overlapping_ranges_and_a_missing_system_are_refused_naming_them(tmp_path):
    sft, run, other = _adapter(tmp_path, "sft"), _adapter(tmp_path, "run"), _adapter(tmp_path, "other")
    first = _part(tmp_path / "first", 0, {sft: [(0.0, 1, 1)] * 3, run: [(1.0, 1, 1)] * 3}, {sft: "SFT", run: "R"})
    second = _part(tmp_path / "second", 2, {sft: [(0.0, 1, 1)] * 2, run: [(1.0, 1, 1)] * 2}, {sft: "SFT", run: "R"})
    res = _combine("--part", first, "--part", second, "--sft", sft, "--system", f"R={run}", "--out", tmp_path / "o")
    assert res.returncode != 0 and "questions 3-4" in res.stderr and "overlap 1-3" in res.stderr
    res = _combine("--part", first, "--sft", sft, "--system", f"X={other}", "--out", tmp_path / "o")
    assert res.returncode != 0 and "no cached result for X" in res.stderr
    assert not (tmp_path / "o.json").exists()
    res = _combine("--part", first, "--sft", sft, "--system", f"R={run}", "--out", tmp_path / "one")
    assert res.returncode == 0, res.stderr
    assert list(json.loads((tmp_path / "one.json").read_text())["groups"]) == ["hotpotqa_dev"]   # no pooled copy


def test_each_question_is_paired_with_itself_across_parts_and_sets(tmp_path):
    """The system is the SFT start + 0.1 F1 on every question: any misaligned pairing would spread the CI."""
    sft, run = _adapter(tmp_path, "sft"), _adapter(tmp_path, "run")
    base = {"first": [0.0, 0.5, 0.3], "second": [0.9, 0.2]}
    first = _part(tmp_path / "first", 0, {sft: [(f, 0, 0) for f in base["first"]],
                                          run: [(f + 0.1, 0, 0) for f in base["first"]]}, {sft: "SFT", run: "R"})
    _part(first, 0, {sft: [(0.4, 0, 0)], run: [(0.5, 0, 0)]}, {sft: "SFT", run: "R"}, "musique_dev")
    second = _part(tmp_path / "second", 3, {sft: [(f, 0, 0) for f in base["second"]],
                                            run: [(f + 0.1, 0, 0) for f in base["second"]]}, {sft: "SFT", run: "R"})
    res = _combine("--part", first, "--part", second, "--sft", sft, "--system", f"R={run}", "--out", tmp_path / "o")
    assert res.returncode == 0, res.stderr
    rec = json.loads((tmp_path / "o.json").read_text())["groups"]["pooled"]["paired"]["R"]["f1"]
    assert (rec["diff"], rec["ci_lo"], rec["ci_hi"], rec["n"]) == pytest.approx((10.0, 10.0, 10.0, 6))


def test_parts_decoded_with_other_settings_or_labels_that_clash_are_refused(tmp_path):
    sft, run = _adapter(tmp_path, "sft"), _adapter(tmp_path, "run")
    first = _part(tmp_path / "first", 0, {sft: [(0.0, 1, 1)], run: [(1.0, 1, 1)]}, {sft: "SFT", run: "R"})
    fp32 = _part(tmp_path / "fp32", 1, {sft: [(0.0, 1, 1)], run: [(1.0, 1, 1)]}, {sft: "SFT", run: "R"},
                 dtype="torch.float32")
    res = _combine("--part", first, "--part", fp32, "--sft", sft, "--system", f"R={run}", "--out", tmp_path / "o")
    assert res.returncode != 0 and "other settings than the first part" in res.stderr
    # the run evaluated with other settings than its SFT start within one part
    mixed = _part(tmp_path / "mixed", 0, {sft: [(0.0, 1, 1)]}, {sft: "SFT"})
    _part(tmp_path / "other", 0, {run: [(1.0, 1, 1)]}, {run: "R"}, dtype="torch.float32")
    (tmp_path / "other.cache" / "hotpotqa_dev").rename(tmp_path / "mixed.cache" / "x")
    for f in (tmp_path / "mixed.cache" / "x").iterdir():
        f.rename(tmp_path / "mixed.cache" / "hotpotqa_dev" / f.name)
    res = _combine("--part", mixed, "--sft", sft, "--system", f"R={run}", "--out", tmp_path / "o")
    assert res.returncode != 0 and "R was evaluated with other settings than SFT" in res.stderr
    for labels in (["SFT"], ["R", "R"]):
        res = _combine("--part", first, "--sft", sft, *sum((["--system", f"{x}={run}"] for x in labels), []),
                       "--out", tmp_path / "o")
        assert res.returncode != 0 and "each LABEL once" in res.stderr
    assert not (tmp_path / "o.json").exists()


def test_one_adapter_cached_twice_with_different_results_is_refused_and_identical_copies_pool(tmp_path):
    """The same adapter under two names (a relabelled or re-decoded entry): identical results pool as
    one system; results that differ (bf16 greedy decoding can flip with the thread count) are refused,
    naming both entries, rather than pooling whichever was read first."""
    sft, run = _adapter(tmp_path, "sft"), _adapter(tmp_path, "run")
    part = _part(tmp_path / "p", 0, {sft: [(0.0, 1, 1), (0.0, 1, 1)], run: [(1.0, 1, 1), (0.0, 1, 1)]},
                 {sft: "SFT", run: "R"})
    cache = Cache(tmp_path / "p.cache" / "hotpotqa_dev", 2, {"temperature": 0.0, "dtype": "torch.bfloat16"})
    cache.put("R again", adapter_digest(str(run)), [dict(em=1.0, f1=1.0, selector_precision=1, selector_recall=1),
                                                    dict(em=0.0, f1=0.0, selector_precision=1, selector_recall=1)])
    res = _combine("--part", part, "--sft", sft, "--system", f"R={run}", "--out", tmp_path / "same")
    assert res.returncode == 0, res.stderr
    cache.put("R again", adapter_digest(str(run)), [dict(em=1.0, f1=1.0, selector_precision=1, selector_recall=1),
                                                    dict(em=0.0, f1=0.5, selector_precision=1, selector_recall=1)])
    res = _combine("--part", part, "--sft", sft, "--system", f"R={run}", "--out", tmp_path / "differ")
    assert res.returncode != 0 and "cached under several names" in res.stderr
    assert "'R'" in res.stderr and "'R again'" in res.stderr
    assert not (tmp_path / "differ.json").exists()


def test_mmoa_eval_cache_key_is_what_decoding_reads_and_nothing_else():
    """The key of a cached evaluation, pinned to the one its stored entries were written with: a
    training-only rollout setting (the wall-time bounds, turns_in_slot: evaluation resets each) must
    not change it, or every earlier system is decoded again (~10 min each on 258 questions). A new
    RolloutConfig field fails here until it is placed in or out of the key on purpose."""
    from experiments.mmoa.mmoa_eval import cache_settings
    from ragrl.rollout.config import RolloutConfig

    pinned = {"max_turns": 4, "max_turn_tokens": 128, "max_response_tokens": 768, "max_obs_tokens": 192,
              "passage_words": 30, "max_queries_per_call": 3, "max_searches": None, "topk": 3, "temperature": 0.0,
              "top_p": 1.0, "n": 1, "seed": 0, "dtype": "torch.bfloat16"}
    rollout = RolloutConfig(temperature=0.0, passage_words=30)
    assert cache_settings(rollout, "torch.bfloat16", 0) == pinned
    branched = RolloutConfig(temperature=0.0, passage_words=30, max_episode_s=30.0, turns_in_slot=False)
    assert cache_settings(branched, "torch.bfloat16", 0) == pinned
    assert cache_settings(rollout, "torch.bfloat16", 100) == {**pinned, "skip": 100}
    assert cache_settings(RolloutConfig(temperature=0.7, passage_words=30), "torch.bfloat16", 0) != pinned


def test_family_option_adds_z_and_a_wider_bonferroni_ci_and_refuses_a_family_of_one(tmp_path):
    sft, run = _adapter(tmp_path, "sft"), _adapter(tmp_path, "run")
    part = _part(tmp_path / "p", 0, {sft: [(0.0, 1, 1), (0.5, 1, 1), (0.2, 1, 1), (0.1, 1, 1), (0.4, 1, 1)],
                                     run: [(1.0, 1, 1), (0.5, 1, 1), (0.2, 1, 1), (0.4, 1, 1), (0.4, 1, 1)]},
                 {sft: "SFT", run: "R"})
    res = _combine("--part", part, "--sft", sft, "--system", f"R={run}", "--out", tmp_path / "o", "--family", "38")
    assert res.returncode == 0, res.stderr
    group = json.loads((tmp_path / "o.json").read_text())["groups"]["hotpotqa_dev"]
    # F1 differences 1, 0, 0, 0.3, 0: mean 0.26, sample sd sqrt(0.752 / 4) = 0.4336, z = 0.26 / (0.4336 / sqrt 5)
    lo, hi, z = group["family"]["paired"]["R"]["f1"]
    assert z == pytest.approx(1.3408, abs=1e-3)
    assert group["family"]["alpha"] == pytest.approx(0.05 / 38)
    lo95, hi95 = group["paired"]["R"]["f1"]["ci_lo"] / 100, group["paired"]["R"]["f1"]["ci_hi"] / 100
    assert lo <= lo95 and hi >= hi95 and (lo, hi) != (lo95, hi95)
    assert group["family"]["paired"]["R"]["selector_f1"][2] == 0.0   # identical selections
    assert "family of 38 tests" in (tmp_path / "o.md").read_text()
    res = _combine("--part", part, "--sft", sft, "--system", f"R={run}", "--out", tmp_path / "x", "--family", "1")
    assert res.returncode != 0 and "--family takes the number of tests" in res.stderr
    assert not (tmp_path / "x.json").exists()
