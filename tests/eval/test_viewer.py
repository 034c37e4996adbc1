"""`ragrl view`: a self-contained HTML page, checked in a real headless Chromium: it loads, its
filters change what is shown, two systems sit side by side, and 10k trajectories stay paged."""
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from ragrl.eval.report import write_trajectories
from ragrl.eval.viewer import collect, write_view
from ragrl.rollout.trajectory import Trajectory, Turn

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def traj(i: int, right: bool, searched: bool, answer: str | None = None) -> Trajectory:
    turns = []
    if searched:
        turns.append(Turn(action_text="<search> q </search>", kind="search", queries=["q"],
                          passage_ids=[["p1", f"p{i}x"]], observation="<information>Doc 1 secret obs</information>"))
    turns.append(Turn(action_text=f"<answer> {answer or ('Paris' if right else 'Rome')} </answer>", kind="answer"))
    return Trajectory(sample_id=f"q{i}", question=f"Question {i}: capital of France?", golds=["Paris"], token_ids=[],
                      action_mask=[], logprobs=[], prompt_len=0, turns=turns, answer=answer or ("Paris" if right else "Rome"),
                      num_searches=int(searched), reward=float(right), metrics={"em": float(right), "f1": float(right)})


@pytest.fixture
def run_dir(tmp_path):
    d = tmp_path / "eval"
    d.mkdir()
    write_trajectories(d / "trajectories_agent.jsonl", [traj(i, right=i % 3 == 0, searched=i % 2 == 0) for i in range(30)])
    write_trajectories(d / "trajectories_naive_rag.jsonl", [traj(i, right=i % 5 == 0, searched=True) for i in range(30)])
    (d / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "reward_mean": s / 10}) + "\n" for s in range(10)))
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"id": f"q{i}", "question": "x", "answers": ["Paris"], "gold_passage_ids": ["p1"]})
                            + "\n" for i in range(30)))
    (d / "report.json").write_text(json.dumps({"settings": {"data_file": str(data)}}))
    return d


def test_collect_reads_systems_gold_ids_and_curves(run_dir, tmp_path):
    data = collect(run_dir)
    assert set(data["systems"]) == {"agent", "naive_rag"} and len(data["systems"]["agent"]) == 30
    assert data["gold_ids"]["q4"] == ["p1"] and data["curves"]["reward_mean"][-1] == [9, 0.9]
    page = write_view(run_dir).read_text()
    assert "<script src" not in page and "http" not in page.split("<script")[0]     # no CDN, no network
    with pytest.raises(Exception, match="no trajectories"):
        collect(tmp_path / "empty") if (tmp_path / "empty").mkdir() is None else None


def cards(html: str) -> int:
    """Rendered question cards (the page's own script holds the template text, not an id)."""
    return len(re.findall(r'class="card" data-id="q\d+"', html))


def dom(page: Path, fragment: str, tmp_path: Path) -> str:
    out = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                          "--disable-background-networking", "--disable-component-update", "--disable-sync",
                          f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=5000", "--dump-dom",
                          f"{page.as_uri()}#{fragment}"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


@pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (install.sh installs it where apt-get runs as root)")
def test_page_in_headless_chromium(run_dir, tmp_path):
    page = write_view(run_dir)
    everything = dom(page, "a=agent", tmp_path)
    assert cards(everything) == 30 and "30 of 30" in everything
    wrong = dom(page, "a=agent&filter=wrong", tmp_path)
    assert cards(wrong) == 20 and "secret obs" in dom(page, "a=agent&filter=searched", tmp_path)
    assert cards(dom(page, "a=agent&filter=nosearch", tmp_path)) == 15
    both = dom(page, "a=agent&b=naive_rag&filter=right", tmp_path)
    assert cards(both) == 10 and both.count('<div class="col"><div class="meta">naive_rag</div>') == 10   # side by side
    assert '<span class="pid g">p1</span>' in both                          # gold passage highlighted
    assert '<div class="obs">&lt;information&gt;Doc 1 secret obs' in both   # observation in the masked style
    shot = tmp_path / "view.png"
    subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                    f"--user-data-dir={tmp_path / 'profile2'}", "--window-size=1200,900", f"--screenshot={shot}",
                    f"{page.as_uri()}#a=agent&b=naive_rag"], capture_output=True, timeout=120)
    assert shot.stat().st_size > 10_000


@pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed")
def test_ten_thousand_trajectories_stay_paged(tmp_path):
    d = tmp_path / "big"
    d.mkdir()
    write_trajectories(d / "trajectories_agent.jsonl", [traj(i, right=i % 2 == 0, searched=True) for i in range(10_000)])
    page = write_view(d)
    out = dom(page, "a=agent&filter=right&page=3", tmp_path)
    assert cards(out) == 50 and "5000 of 10000" in out and "page 4/100" in out
