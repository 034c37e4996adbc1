"""ragrl.eval.tables: paired-difference cells and rows, and a result written as OUT.json + OUT.md."""
import json

from ragrl.eval.tables import diff_cell, paired_row, write_results


def test_cells_and_rows_are_in_points_with_the_p_value():
    d = (-0.0456, -0.1, 0.0123, 0.5)
    assert diff_cell(d) == "-4.6 [-10.0, +1.2], p 0.500"
    assert paired_row("X", {"f1": d}, ("f1",)) == "| X | -4.6 [-10.0, +1.2], p 0.500 |"


def test_write_results_writes_json_and_markdown_beside_each_other_and_prints_the_table(tmp_path, capsys):
    write_results(tmp_path / "out", {"a": [1, 2]}, ["# title", "", "| x |"])
    assert json.loads((tmp_path / "out.json").read_text()) == {"a": [1, 2]}
    assert (tmp_path / "out.json").read_text() == '{\n "a": [\n  1,\n  2\n ]\n}'
    assert (tmp_path / "out.md").read_text() == "# title\n\n| x |"
    assert capsys.readouterr().out == "# title\n\n| x |\n"
