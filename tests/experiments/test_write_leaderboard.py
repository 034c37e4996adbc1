"""The leaderboard writer over real comparisons' JSON (candidates T and W on eval/, issue #53): the compact
table's search-gain columns, the JSON record beside the Markdown, and parts made apart merged into one."""
import json
from pathlib import Path

import pytest

from experiments.leaderboard.write_leaderboard import compact_table, leaderboard_record, merge_parts, read_parts
from experiments.search_agents import per_set
from ragrl.compare.comparison import seed_cache
from ragrl.compare.systems import cached_entry
from ragrl.eval.cells import diff_cell

COMPARE = Path(__file__).resolve().parents[2] / "experiments/search_agents/results/learn_t_eval_compare.json"


def test_compact_table_puts_search_gain_and_its_paired_difference_beside_f1():
    data = json.loads(COMPARE.read_text())
    lines = compact_table(data)
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert header[3:6] == ["F1", "answer@shown", "search gain"]
    rows = {cells[1]: cells for cells in ([c.strip() for c in ln.strip("|").split("|")] for ln in lines[2:])}
    assert [ln.split("|")[2].strip() for ln in lines[2:]] == sorted(
        data["rows"], key=lambda n: -data["rows"][n]["f1"]["mean"])          # ranked by F1
    t = rows["learn_t"]
    assert t[5] == "+3.1 [+0.7, +5.6]"                                      # its own search gain
    assert t[9].startswith("+1.5 [-0.1, +3.1]")                             # Δsearch gain vs its start
    assert t[7] == "0.0%" and rows["direct"][9] == ""                        # a baseline has no start
    assert t[11].endswith("min")


def test_the_json_record_keeps_each_systems_figures_in_f1_order():
    data = json.loads(COMPARE.read_text())
    rec = leaderboard_record(data)
    names = [s["system"] for s in rec["systems"]]
    assert names == sorted(data["rows"], key=lambda n: -data["rows"][n]["f1"]["mean"])
    t = next(s for s in rec["systems"] if s["system"] == "learn_t")
    assert t["vs_start"]["search_gain"] == data["vs_start"]["learn_t"]["search_gain"]
    assert t["search_gain"]["mean"] > 0 and t["questions"] == 803 and t["trained"]["seconds"] > 0
    assert rec["meta"]["questions"].startswith("803")
    assert next(s for s in rec["systems"] if s["system"] == "naive_rag")["vs_start"] is None


RESULTS = COMPARE.parent
PARTS = Path(__file__).resolve().parents[2] / "experiments/leaderboard/results"


def test_parts_made_apart_merge_into_one_table_with_each_runs_own_start():
    """Two comparisons of the same 803 questions (candidates T and W, each with its start and the
    shared baselines) read as one: the baselines once, both runs with their own paired differences."""
    t, w = (json.loads((RESULTS / f"learn_{x}_eval_compare.json").read_text()) for x in ("t", "w"))
    merged = merge_parts([t, w])
    assert sorted(merged["rows"]) == sorted({*t["rows"], *w["rows"]})
    assert len(merged["rows"]) == 6                       # direct, naive_rag, two runs, two starts
    assert merged["vs_start"]["learn_t"] == t["vs_start"]["learn_t"]
    assert merged["vs_start"]["learn_w"] == w["vs_start"]["learn_w"]
    assert merged["meta"]["date"] == "2026-12-02, 2026-12-03"
    names = [cells.split("|")[2].strip() for cells in compact_table(merged)[2:]]
    assert set(names) == set(merged["rows"]) and len(names) == 6


def test_parts_that_differ_in_a_setting_or_a_baseline_are_refused():
    t, w = (json.loads((RESULTS / f"learn_{x}_eval_compare.json").read_text()) for x in ("t", "w"))
    other_seed = {**w, "meta": {**w["meta"], "seed": 1}}
    with pytest.raises(ValueError, match="differ in seed"):
        merge_parts([t, other_seed])
    other_corpus = {**w, "meta": {**w["meta"], "corpus": "x.jsonl.gz (10 passages, sha256 000000000000)"}}
    with pytest.raises(ValueError, match="different corpora"):
        merge_parts([t, other_corpus])
    moved = {**w, "rows": {**w["rows"], "naive_rag": {**w["rows"]["naive_rag"], "f1": {"mean": 1.0}}}}
    with pytest.raises(ValueError, match="naive_rag is in two parts"):
        merge_parts([t, moved])
    with pytest.raises(ValueError, match=r"learn_t \(start\) is in two parts"):
        merge_parts([t, t])


def test_the_set_by_set_table_reads_each_parts_per_set_record():
    data, per_sets = read_parts([RESULTS / "learn_w_eval_compare.json"])
    assert data["vs_start"]["learn_w"] and len(per_sets) == 1
    lines = per_set.table(per_sets, metrics=("search_gain", "f1"))
    sets = [ln.split("|")[2].strip() for ln in lines[2:]]
    assert "pooled" in sets and len(sets) == 4
    pooled = per_sets[0]["sets"]["pooled"]
    assert lines[2 + sets.index("pooled")].split("|")[6].strip() == diff_cell(pooled["search_gain"]["run - start"])


def test_the_committed_parts_merge_and_their_baseline_episodes_unpack_intact(tmp_path):
    """The remake's committed parts make one table, and the baselines' committed episodes (gzipped) unpack
    through `--cache-from`'s seeding to entries that pass the cache's own checks for all 803 questions."""
    parts = sorted((PARTS).glob("*_compare.json"))
    data, per_sets = read_parts(parts)
    assert data["meta"]["questions"].startswith("803") and len(per_sets) == len(parts)
    seed_cache(tmp_path, [PARTS / "baselines" / "systems"])
    names = set()
    for record in tmp_path.glob("*.json"):
        kept = json.loads(record.read_text())
        trajs, _ = cached_entry(record.with_suffix(".jsonl"), record, kept["key"], kept["name"], 803)
        assert len(trajs) == 803
        names.add(kept["name"])
    assert names == {"direct", "naive_rag"}
    assert {n for n, r in data["rows"].items() if r["role"] == "baseline"} == names
