import json

import numpy as np
import pytest
from PIL import Image

from ragrl.errors import RagrlError
from ragrl.eval.plots import bar_chart, line_plot
from ragrl.eval.report import (compare_report, format_table, load_trajectories, recompute_summary,
                               write_report)
from ragrl.eval.stats import summarize
from ragrl.engines.base import SamplingParams
from ragrl.rollout.trajectory import Trajectory, Turn


def synthetic_system(p_correct, n=60, seed=0, searches=1):
    """n scored trajectories whose EM is 1 with probability p_correct."""
    rng = np.random.default_rng(seed)
    trajs = []
    for i in range(n):
        em = float(rng.random() < p_correct)
        f1 = em if em else float(rng.choice([0.0, 0.25, 0.5]))
        turn = Turn(action_text="<search>q</search>", kind="search", queries=["q"], passage_ids=[["p1", "p2"]])
        trajs.append(Trajectory(
            sample_id=f"q{i}", question=f"question {i}?", golds=["gold"], token_ids=[5, 6, 7, 8],
            action_mask=[0, 1, 1, 0], logprobs=[0.0, -0.5, -0.25, 0.0], prompt_len=1, turns=[turn],
            answer="gold" if em else "other", num_searches=searches, num_turns=searches + 1,
            format_errors=int(i % 10 == 0), stop_reason="answer",
            metrics={"em": em, "f1": f1, "cover_em": max(em, f1 > 0), "gen_tokens": 2 + i % 3}))
    return trajs


@pytest.fixture()
def results():
    systems = {"naive_rag": synthetic_system(0.2, seed=1, searches=0),
               "search_r1/grpo": synthetic_system(0.45, seed=2, searches=2)}
    return {name: {"summary": summarize(t, wall_time_s=3.0 + i), "trajectories": t}
            for i, (name, t) in enumerate(systems.items())}


def test_report_numbers_recompute_from_jsonl(tmp_path, results):
    meta = {"model": "smollm2-135m", "agent": "search_r1", "index": "bm25", "data_file": "eval.jsonl.gz",
            "seed": 0, "decoding": SamplingParams(temperature=0.0, max_new_tokens=64)}
    report = write_report(tmp_path, results, meta, baseline="naive_rag")
    on_disk = json.loads((tmp_path / "report.json").read_text())
    assert on_disk["systems"] == report["systems"] and on_disk["paired"] == report["paired"]
    assert on_disk["meta"]["n"] == 60 and on_disk["meta"]["ragrl_version"] and on_disk["meta"]["date"]
    assert on_disk["meta"]["decoding"]["max_new_tokens"] == 64
    assert on_disk["files"]["search_r1/grpo"] == "trajectories_search_r1_grpo.jsonl"
    for system, summary in on_disk["systems"].items():
        path = tmp_path / on_disk["files"][system]
        assert recompute_summary(path, wall_time_s=summary["wall_time_s"]) == summary
    # The JSONL keeps everything, metrics and turns included.
    back = load_trajectories(tmp_path / "trajectories_naive_rag.jsonl")
    assert [t.to_dict() for t in back] == [t.to_dict() for t in results["naive_rag"]["trajectories"]]


def test_report_markdown_table_and_paired_section(tmp_path, results):
    write_report(tmp_path, results, {"model": "m"}, baseline="naive_rag")
    md = (tmp_path / "report.md").read_text()
    assert ("| system | EM [95% CI] | F1 [95% CI] | cover-EM [95% CI] | search gain [95% CI] | answer@shown | "
            "searches/q |") in md
    s = results["search_r1/grpo"]["summary"]
    row = next(line for line in md.splitlines() if line.startswith("| search_r1/grpo |"))
    assert f"{s['em']['mean']:.1f} [{s['em']['ci_lo']:.1f}, {s['em']['ci_hi']:.1f}]" in row
    assert "| 2.00 | 3.00 |" in row  # searches/q, turns/q
    assert "| 10.0% |" in row  # 6 of 60 trajectories had a format error
    assert "Differences vs `naive_rag`" in md
    report = json.loads((tmp_path / "report.json").read_text())
    d = report["paired"]["search_r1/grpo"]
    assert d["n_paired"] == 60
    assert d["em"]["diff"] == pytest.approx(s["em"]["mean"] - results["naive_rag"]["summary"]["em"]["mean"])
    assert d["em"]["diff"] > 0


def test_report_rejects_unknown_baseline_and_bad_jsonl(tmp_path, results):
    with pytest.raises(RagrlError, match="baseline system 'nope'"):
        write_report(tmp_path, results, {}, baseline="nope")
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(results["naive_rag"]["trajectories"][0].to_dict()) + "\n{not json\n")
    with pytest.raises(RagrlError, match=r"bad.jsonl:2"):
        load_trajectories(bad)


def test_format_table_lists_every_system(results):
    text = format_table(results)
    assert "search_r1/grpo" in text and "naive_rag" in text
    assert f"{results['naive_rag']['summary']['em']['mean']:.1f}" in text


def test_compare_report_paired_and_unpaired(tmp_path):
    untrained = summarize(synthetic_system(0.1, seed=3), 1.0, per_question=True)
    trained = summarize(synthetic_system(0.5, seed=4), 2.0, per_question=True)
    naive = summarize(synthetic_system(0.2, seed=5), 1.5)  # no per-question values
    data = compare_report(tmp_path / "compare", [("untrained", untrained), ("naive_rag", naive),
                                                 ("trained", trained)], "untrained")
    assert (tmp_path / "compare.json").is_file()
    md = (tmp_path / "compare.md").read_text()
    assert "| trained |" in md and "| naive_rag |" in md
    assert "ci_lo" in data["paired"]["trained"]["em"] and data["paired"]["trained"]["n_paired"] == 60
    assert "ci_lo" not in data["paired"]["naive_rag"]["em"]
    assert data["paired"]["naive_rag"]["em"]["diff"] == pytest.approx(naive["em"]["mean"] - untrained["em"]["mean"])
    assert all("per_question" not in row for row in json.loads((tmp_path / "compare.json").read_text())["rows"])


def test_compare_report_extra_pairs_show_the_gain_of_one_stage(tmp_path):
    sft = summarize(synthetic_system(0.2, seed=6), 1.0, per_question=True)
    rl = summarize(synthetic_system(0.6, seed=7), 1.0, per_question=True)
    naive = summarize(synthetic_system(0.3, seed=8), 1.0, per_question=True)
    rows = [("naive_rag", naive), ("sft", sft), ("sft+rl", rl)]
    data = compare_report(tmp_path / "c", rows, "naive_rag", pairs=[("sft+rl", "sft")])
    gain = data["pairs"]["sft"]["sft+rl"]
    assert gain["em"]["diff"] == pytest.approx(rl["em"]["mean"] - sft["em"]["mean"])
    assert gain["em"]["ci_lo"] <= gain["em"]["diff"] <= gain["em"]["ci_hi"]
    assert "## Differences vs `sft`" in (tmp_path / "c.md").read_text()
    with pytest.raises(RagrlError, match="unknown row 'rl'"):
        compare_report(tmp_path / "d", rows, "naive_rag", pairs=[("rl", "sft")])


def test_bar_chart_png(tmp_path, results):
    path = bar_chart(results, tmp_path / "bars.png", figsize=(8, 4))
    with Image.open(path) as img:
        assert img.format == "PNG" and img.size == (800, 400)
        # Not a blank canvas: the bars put many colours on it.
        assert len(img.convert("RGB").getcolors(maxcolors=100_000)) > 10


def test_line_plot_skips_missing_keys(tmp_path):
    rows = [{"step": s, "reward": 0.1 * s, "em": s / 20} for s in range(20)]
    rows[3].pop("em")
    plotted = line_plot(rows, ["reward", "em", "num_searches"], tmp_path / "curves.png", smooth=0.5)
    assert plotted == ["reward", "em"]
    with Image.open(tmp_path / "curves.png") as img:
        assert img.size == (800, 300)  # two 4x3-inch panels side by side at 100 dpi
    four = line_plot(rows, ["reward", "em", "reward", "em"], tmp_path / "grid.png", cols=3)
    assert len(four) == 4
    with Image.open(tmp_path / "grid.png") as img:
        assert img.size == (1200, 600)  # 3 columns, 2 rows
    with pytest.raises(RagrlError, match="none of"):
        line_plot(rows, ["kl"], tmp_path / "none.png")


def test_report_accepts_harness_output_without_summaries(tmp_path):
    # evaluate() returns {system: {"trajectories": [...], "wall_s": t}}; summaries are computed here.
    trajs = synthetic_system(0.3, n=40, seed=9)
    report = write_report(tmp_path, {"search_r1": {"trajectories": trajs, "wall_s": 4.5}}, {"model": "m"})
    summary = report["systems"]["search_r1"]
    assert summary["wall_time_s"] == 4.5 and summary["n"] == 40
    assert summary == recompute_summary(tmp_path / "trajectories_search_r1.jsonl", wall_time_s=4.5)
    assert report["paired"] == {}
    assert "search_r1" in format_table({"search_r1": {"trajectories": trajs, "wall_s": 4.5}})


def test_line_plot_shades_a_confidence_band_when_rows_carry_one(tmp_path):
    rows = [{"step": s, "f1": 5.0 + s, "f1_lo": 3.0 + s, "f1_hi": 7.0 + s, "em": 1.0} for s in range(4)]
    line_plot(rows, ["f1"], tmp_path / "band.png")
    line_plot([{k: v for k, v in r.items() if not k.endswith(("_lo", "_hi"))} for r in rows], ["f1"],
              tmp_path / "plain.png")
    with Image.open(tmp_path / "band.png") as band, Image.open(tmp_path / "plain.png") as plain:
        # the band paints a light fill over many pixels that the plain line leaves white
        white = lambda img: sum(1 for px in img.convert("RGB").getdata() if px == (255, 255, 255))  # noqa: E731
        assert white(band) < white(plain) - 2000


def test_the_search_gain_columns_show_where_the_summary_has_them(tmp_path, results):
    """`ragrl eval` adds the search gain at equal passages to a system whose episodes recorded their
    passages (eval/search_gain.py); the table shows it with its CI and answer@shown, and n/a elsewhere."""
    results["search_r1/grpo"]["summary"].update(search_gain={"mean": 4.5, "ci_lo": -1.25, "ci_hi": 10.0, "n": 60},
                                                answer_shown={"mean": 61.0, "ci_lo": 50.0, "ci_hi": 70.0, "n": 60})
    write_report(tmp_path, results, {"model": "m"}, baseline="naive_rag")
    lines = (tmp_path / "report.md").read_text().splitlines()
    agent = next(line for line in lines if line.startswith("| search_r1/grpo |"))   # the table's row (first)
    naive = next(line for line in lines if line.startswith("| naive_rag |"))
    assert "| +4.5 [-1.2, +10.0] | 61.0 |" in agent and "| n/a | n/a |" in naive
