"""ragrl.eval.cells: the one place a CI or a paired difference becomes a table cell, and a result
written as OUT.json + OUT.md."""
import json

from ragrl.eval.cells import ci_cell, diff_cell, paired_row, write_results
from ragrl.eval.stats import ci_record, paired_record


def test_cells_and_rows_are_in_points_with_the_p_value():
    d = {"diff": -4.56, "ci_lo": -10.0, "ci_hi": 1.23, "p_value": 0.5, "n": 9}
    assert diff_cell(d, with_p=True) == "-4.6 [-10.0, +1.2], p 0.500"
    assert diff_cell({**d, "p_value": 0.0002}, with_p=True) == "-4.6 [-10.0, +1.2], p <0.001"
    assert paired_row("X", {"f1": d}, ("f1",)) == "| X | -4.6 [-10.0, +1.2], p 0.500 |"


def test_the_records_feed_the_cells_in_the_tables_unit():
    """ci_record and paired_record turn 0-1 scores into percent and points, the unit the cells print."""
    a, b = [0.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 0.0]
    rec = paired_record(a, b)
    assert (rec["diff"], rec["n"]) == (25.0, 4) and rec["ci_lo"] <= 25.0 <= rec["ci_hi"]
    assert diff_cell(rec).startswith("+25.0 [")
    assert ci_cell(ci_record(a)).startswith("50.0 [")
    assert ci_cell(ci_record([1.5, 2.5], scale=1.0), ".2f", signed=True).startswith("+2.00 [+")


def test_write_results_writes_json_and_markdown_beside_each_other_and_prints_the_table(tmp_path, capsys):
    write_results(tmp_path / "out", {"a": [1, 2]}, ["# title", "", "| x |"])
    assert json.loads((tmp_path / "out.json").read_text()) == {"a": [1, 2]}
    assert (tmp_path / "out.json").read_text() == '{\n "a": [\n  1,\n  2\n ]\n}'
    assert (tmp_path / "out.md").read_text() == "# title\n\n| x |"
    assert capsys.readouterr().out == "# title\n\n| x |\n"
