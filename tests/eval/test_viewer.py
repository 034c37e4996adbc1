"""`ragrl view`: a self-contained HTML page, checked in a real headless Chromium: it loads, its
filters change what is shown, two systems sit side by side, and 10k trajectories stay paged; a
retriever's results (base vs trained top k per question) likewise, and the curves have axes."""
import json
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from ragrl.datasets import load_questions
from ragrl.eval.report import write_trajectories
from ragrl.eval.retrieval import by_question_kind, compare_retrievers, question_kind
from ragrl.eval.retriever_view import ROWS_FILE, retrieval_rows, snippet, write_retrieval_rows
from ragrl.eval.viewer import collect, write_view
from ragrl.retrieval.base import Hit
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
    every = dom(page, "a=agent&b=*&filter=right", tmp_path)                  # every system on each question
    assert every.count('<tr class="every"><td>naive_rag</td>') == 10 and "gold 1/1" in every
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


# --- the retriever's view (ragrl.eval.retriever_view): per question, base vs trained top k -------------------------

def rcards(html: str) -> int:
    return len(re.findall(r'class="card rcard" data-id="[^$"]', html))   # not the template's ${...}


def test_retrieval_rows_mark_gold_and_answer_passages_on_a_hand_made_case(tmp_path):
    """The rows `ragrl eval --systems retrieval` and the quickstart write, from compare_retrievers'
    own hits and per-question metrics: passages per hop, gold (★) and answer-bearing (✓) marks by
    the answer@k test, each system's recall and answer@k; yes/no questions get no answer marks."""
    long = " ".join(f"w{i}" for i in range(60))
    corpus = {"g1": Hit("g1", "Paris", "Paris is the capital of France. " + long, 0.0),
              "g2": Hit("g2", "France", "A country in Europe.", 0.0),
              "x1": Hit("x1", "Rome", "Rome is in Italy.", 0.0), "x2": Hit("x2", "Lyon", "A city.", 0.0),
              "x3": Hit("x3", "Yes", "yes yes yes", 0.0)}
    samples = [{"id": "q1", "question": "Capital of France?", "answers": ["Paris"], "gold_passage_ids": ["g1", "g2"],
                "type": "bridge"},
               {"id": "3hop1__7", "question": "Is Rome in Italy?", "answers": ["yes"], "gold_passage_ids": ["x1"]}]
    ranked = {"base": {"Capital of France?": ["x1", "x2", "g2", "x3"], "Is Rome in Italy?": ["x2", "x3", "x1", "g1"]},
              "new": {"Capital of France?": ["g1", "x1", "g2", "x2"], "Is Rome in Italy?": ["x3", "x2", "g2", "g1"]}}

    def search(name):
        return lambda queries, k: [[corpus[i] for i in ranked[name][q]] for q in queries]

    hits: dict = {}
    comp = compare_retrievers({"base": search("base"), "new": search("new")}, samples, 2, baseline="base",
                              hop_size=2, hits_out=hits)
    assert [h.id for h in hits["new"]["q1"]] == ["g1", "x1", "g2", "x2"]
    assert "hits" in comp["base"]["per_question"]["q1"] and json.dumps(comp["base"])   # results stay JSON (ids only)
    rows = retrieval_rows(samples, hits, {s: comp[s]["per_question"] for s in hits}, set_name="toy", hop_size=2)
    path = write_retrieval_rows(tmp_path / ROWS_FILE, rows)
    back = [json.loads(line) for line in path.read_text().splitlines()]
    assert back == rows and len(back) == 2
    q1, q2 = back
    assert {k: q1[k] for k in ("id", "set", "kind", "question", "answers", "gold_ids")} == {
        "id": "q1", "set": "toy", "kind": "bridge", "question": "Capital of France?", "answers": ["Paris"],
        "gold_ids": ["g1", "g2"]}
    assert list(q1["systems"]) == ["base", "new"]                          # the baseline first
    base, new = q1["systems"]["base"], q1["systems"]["new"]
    assert [[p["id"] for p in hop] for hop in base["hops"]] == [["x1", "x2"], ["g2", "x3"]]   # two hops of 2
    assert [(p["id"], p["gold"], p["answer"]) for hop in new["hops"] for p in hop] == [
        ("g1", True, True), ("x1", False, False), ("g2", True, False), ("x2", False, False)]
    assert (base["recall"], base["answer_at_k"], new["recall"], new["answer_at_k"]) == (0.5, 0.0, 1.0, 1.0)
    assert new["hops"][0][0]["title"] == "Paris" and new["hops"][0][0]["text"] == snippet(corpus["g1"].text)
    assert len(new["hops"][0][0]["text"].split()) == 41 and new["hops"][0][0]["text"].endswith("…")   # 40 words + …
    assert q2["kind"] == "3hop" and q2["systems"]["base"]["answer_at_k"] is None               # yes/no: no answer@k
    assert all(p["answer"] is None for hop in q2["systems"]["new"]["hops"] for p in hop)
    assert [p["gold"] for hop in q2["systems"]["base"]["hops"] for p in hop] == [False, False, True, False]


def two_hop_search(index, pick):
    """A real two-hop search over the demo BM25 index: hop 2 adds the question + a title hop 1 found."""
    def search(queries, k):
        first = index.search(queries, k)
        second = index.search([q + " " + pick(h).title for q, h in zip(queries, first)], 2 * k)
        return [h1 + [h for h in h2 if h.id not in {x.id for x in h1}][:k] for h1, h2 in zip(first, second)]
    return search


@pytest.fixture
def retrieval_dir(tmp_path, demo_bm25_index):
    """A quickstart-like folder: the real comparison over the demo BM25 index (40 questions, two hops
    of 3) written by the real writer, and the run's rl/metrics.jsonl."""
    d = tmp_path / "qs"
    (d / "rl").mkdir(parents=True)
    samples = load_questions("demo-eval")[:40]
    hits: dict = {}
    comp = compare_retrievers({"base encoder": two_hop_search(demo_bm25_index, lambda h: h[0]),
                               "RL encoder": two_hop_search(demo_bm25_index, lambda h: h[-1])},
                              samples, 3, baseline="base encoder", hop_size=3, hits_out=hits)
    rows = retrieval_rows(samples, hits, {s: comp[s]["per_question"] for s in hits}, set_name="demo", hop_size=3)
    write_retrieval_rows(d / ROWS_FILE, rows)
    (d / "rl" / "config.yaml").write_text("policy: retriever\n")
    (d / "rl" / "metrics.jsonl").write_text("".join(json.dumps(
        {"step": s, "reward_mean": 0.5 + s / 100, "f1": 0.0, **({"eval/recall": 40 + s / 2} if s % 10 == 0 else {})})
        + "\n" for s in range(40)))
    return {"dir": d, "samples": samples, "comp": comp, "rows": rows}


def test_collect_finds_the_rows_from_the_run_and_an_eval_folder(retrieval_dir, tmp_path):
    d = retrieval_dir["dir"]
    for where in (d, d / "rl"):                       # the quickstart folder, or its rl/ pointing up
        data = collect(where)
        r = data["retrieval"]
        assert r["systems"] == ["base encoder", "RL encoder"] and len(r["rows"]) == 40
        assert set(data["curves"]) == {"reward_mean", "eval/recall"} and data["flat"] == {"f1": 0.0}
    row = r["rows"][0]
    assert len(row["s"][0]["h"]) == 2 and all(len(h) == 3 for h in row["s"][0]["h"])
    assert all(p in r["passages"] for x in row["s"] for h in x["h"] for p in h)
    ev = tmp_path / "ev"                              # an eval --out folder: curves from the run it names
    ev.mkdir()
    shutil.copy(d / ROWS_FILE, ev / ROWS_FILE)
    (ev / "retrieval.json").write_text(json.dumps({"settings": {"run": str(d / "rl")}}))
    assert set(collect(ev)["curves"]) == {"reward_mean", "eval/recall"} and collect(ev)["retrieval"]["rows"]


@pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed")
def test_retriever_page_in_headless_chromium(retrieval_dir, tmp_path):
    d, samples, comp = retrieval_dir["dir"], retrieval_dir["samples"], retrieval_dir["comp"]
    base_pq, rl_pq = comp["base encoder"]["per_question"], comp["RL encoder"]["per_question"]
    page = write_view(d)
    assert page == d / "view.html" and "<script src" not in page.read_text()
    out = dom(page, "", tmp_path)
    # base and trained top k side by side, two hops each, gold and answer passages marked
    assert rcards(out) == 40 and "40 of 40 questions" in out
    assert out.count('<div class="col rsys" data-sys="base encoder">') == 40
    assert out.count('<div class="col rsys" data-sys="RL encoder">') == 40
    assert '<div class="hop">hop 2</div>' in out
    gold_row = next(r for r in retrieval_dir["rows"] if any(p["gold"] for h in r["systems"]["base encoder"]["hops"] for p in h))
    gold_pid = next(p["id"] for h in gold_row["systems"]["base encoder"]["hops"] for p in h if p["gold"])
    assert re.search(rf'<div class="psg g( a)?" data-pid="{gold_pid}"><span class="mk"><span class="st">★</span>', out)
    assert re.search(r'<div class="psg( g)? a" data-pid="p\d+"><span class="mk">(<span class="st">★</span>)?'
                     r'<span class="ck">✓</span>', out)
    # the filters: gained / lost / unchanged by answer@k and by gold recall, as compare_retrievers counted
    for key, name in (("answer_at_k", "answer"), ("recall", "recall")):
        both = [q for q in base_pq if key in base_pq[q] and key in rl_pq[q]]
        want = {"gained": sum(rl_pq[q][key] > base_pq[q][key] for q in both),
                "lost": sum(rl_pq[q][key] < base_pq[q][key] for q in both)}
        assert want == comp["changed"]["RL encoder"][key]
        want["same"] = len(both) - want["gained"] - want["lost"]
        for how, n in want.items():
            shown = dom(page, f"rf={name}-{how}", tmp_path)
            assert f"{n} of 40 questions" in shown and rcards(shown) == n, (name, how)
    assert sum(comp["changed"]["RL encoder"]["recall"].values()) > 0          # the filters had something to do
    # the text box: a word of one question
    one = dom(page, "rq=" + "Maria%20Golovin", tmp_path)
    assert rcards(one) == sum("maria golovin" in (q["question"] + " ".join(q["answers"])).lower()
                              or any("maria golovin" in p["title"].lower() for x in r["systems"].values()
                                     for h in x["hops"] for p in h)
                              for q, r in zip(samples, retrieval_dir["rows"])) >= 1
    # the per-kind summary: the numbers the quickstart's report gives (by_question_kind)
    for kind in by_question_kind(samples, base_pq, rl_pq, "answer_at_k"):
        tr = re.search(rf'<tr class="" data-set="demo" data-kind="{kind["kind"]}">(.*?)</tr>', out).group(1)
        cells = re.findall(r"<td[^>]*>(.*?)</td>", tr)
        assert cells[:3] == ["demo", kind["kind"], str(sum(question_kind(q) == kind["kind"] for q in samples))]
        assert cells[3].startswith(f"{kind['base']:.1f} → {kind['new']:.1f} ") and f"(n={kind['n']})" in cells[3]
        assert cells[4] == (f"+{kind['gained']}" if kind["gained"] else "0")
        assert cells[5] == (f"−{kind['lost']}" if kind["lost"] else "0")
    # curves: the metric as a title, ticks, steps on x, a legend; a flat metric named, not drawn
    svg = re.search(r'<svg class="curve" data-metric="reward_mean".*?</svg>', out).group(0)
    assert '<text class="ctitle" x="8" y="14">reward_mean</text>' in svg and ">raw</text>" in svg and ">EMA 0.9</text>" in svg
    assert ">step</text>" in svg and ">30</text>" in svg and len(re.findall(r'<text class="tick"', svg)) >= 6
    assert ">value</text>" in re.search(r'<svg class="curve" data-metric="eval/recall".*?</svg>', out).group(0)
    assert "constant throughout (not drawn): f1 = 0" in out and 'data-metric="f1"' not in out
    # an eval folder with trajectories too: the retrieval section first, the trajectories one click away
    write_trajectories(d / "trajectories_agent.jsonl", [traj(i, right=True, searched=False) for i in range(3)])
    page = write_view(d)
    assert rcards(dom(page, "", tmp_path)) == 40 and cards(dom(page, "view=traj", tmp_path)) == 3


@pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed")
def test_ten_thousand_retrieval_questions_render_a_page_at_a_time(tmp_path):
    d = tmp_path / "big"
    d.mkdir()
    pool = [Hit(f"p{i}", f"Title {i}", f"text of passage {i} " * 8, 0.0) for i in range(3000)]
    samples = [{"id": f"q{i}", "question": f"Question {i}?", "answers": [f"answer {i % 7}"], "type": ("bridge", "comparison")[i % 2],
                "gold_passage_ids": [f"p{i % 3000}"]} for i in range(10_000)]
    hits = {"base": {f"q{i}": [pool[(i + j) % 3000] for j in range(6)] for i in range(10_000)},
            "trained": {f"q{i}": [pool[(i + 2 * j) % 3000] for j in range(6)] for i in range(10_000)}}
    metrics = {s: {f"q{i}": {"recall": float(i % (2 + (s == "trained")) == 0), "answer_at_k": float(i % 2)}
                   for i in range(10_000)} for s in hits}
    write_retrieval_rows(d / ROWS_FILE, retrieval_rows(samples, hits, metrics, set_name="synthetic", hop_size=3))
    page = write_view(d)
    t0 = time.perf_counter()
    out = dom(page, "rf=recall-lost&rp=2", tmp_path)
    wall = time.perf_counter() - t0
    lost = sum(i % 2 == 0 and i % 3 != 0 for i in range(10_000))
    assert f"{lost} of 10000 questions" in out and rcards(out) == 50 and f"page 3/{-(-lost // 50)}" in out
    first = int(re.search(r'data-first-render-ms="(\d+)"', out).group(1))
    print(f"10k retrieval questions: first page {first} ms after load, chromium run {wall:.1f} s")
    assert first < 10_000 and wall < 120, (first, wall)   # a smoke check (load + first page), not a benchmark


def test_a_file_over_the_page_s_limit_is_streamed_and_sampled_on_the_same_questions(tmp_path):
    d = tmp_path / "many"
    d.mkdir()
    write_trajectories(d / "trajectories_agent.jsonl", [traj(i, right=i % 2 == 0, searched=True) for i in range(500)])
    write_trajectories(d / "trajectories_naive_rag.jsonl", [traj(i, right=False, searched=True) for i in range(499, -1, -1)])
    write_trajectories(d / "trajectories_direct.jsonl", [traj(i, right=False, searched=False) for i in range(40)])
    data = collect(d, max_per_system=50)
    shown = {name: [t["id"] for t in rows] for name, rows in data["systems"].items()}
    assert len(shown["agent"]) == 50 and sorted(shown["agent"]) == sorted(shown["naive_rag"])   # the same questions
    assert len(shown["direct"]) == 40 and data["sampled"] == {"agent": [50, 500], "naive_rag": [50, 500]}
    assert collect(d, max_per_system=50)["systems"] == data["systems"]   # the same sample every time
    assert shown["agent"] != [f"q{i}" for i in range(50)]                # not merely the file's head
    page = write_view(d).read_text()
    assert "a fixed sample of question ids" in page and '"sampled": {}' in page   # the default cap: nothing sampled
    (d / "trajectories_agent.jsonl").write_text('{"sample_id": "q1"}\n{"sample_id": \n')
    with pytest.raises(Exception, match=r"trajectories_agent.jsonl:2: invalid JSON"):
        collect(d)
