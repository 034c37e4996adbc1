"""The leaderboard writer over a real comparison's JSON (candidate T on eval/, issue #53): the compact
table's search-gain columns and the JSON record beside the Markdown."""
import json
from pathlib import Path

from experiments.leaderboard.write_leaderboard import compact_table, leaderboard_record

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
