"""docs/own_data.md, run: every `ragrl` line of its bash blocks, in the page's order, through the real
CLI, in a folder holding a corpus (FlashRAG / Search-R1 layout) and question files this test writes.
The only additions are the tiny random model and a 2-step run (TINY), and for `ragrl index import` the
files it names, written here: the page's corpus as `wiki-18.jsonl` and a flat inner-product faiss index
of MiniLM's "passage: " vectors standing in for e5's (no e5 model is installable offline, so the command
runs with `--encoder all-minilm-l6-v2`). So the page cannot drift from what works. Its JSON examples load
as the page says they do."""
from __future__ import annotations

import contextlib
import json
import re
import shlex
import shutil
from pathlib import Path

import faiss
import pytest
import yaml
from typer.testing import CliRunner

from ragrl.cli.main import app
from ragrl.datasets import load_questions
from ragrl.models.embedder import load_embedder
from ragrl.retrieval.corpus import load_corpus

DOC = Path(__file__).resolve().parents[2] / "docs" / "own_data.md"

# (entity, relation, answer): one passage each, one question each
FACTS = [
    ("Quenland", "capital", "Zorvath"), ("Mirelia", "capital", "Ostrava Vey"), ("Tallor", "capital", "Brenn"),
    ("Ulvania", "capital", "Kesh"), ("Parnassia", "capital", "Dunmere"), ("Velgrad", "capital", "Hollin"),
    ("Orrin Vale Mills", "founder", "Ada Morrow"), ("Kestrel Works", "founder", "Tomas Reyl"),
    ("Blue Finch Press", "founder", "Ilse Varga"), ("Harrow Institute", "founder", "Jun Okafor"),
    ("Saltmere Bridge", "architect", "Lena Quist"), ("Gray Spire", "architect", "Pavel Dorn"),
    ("Lantern Hall", "architect", "Mira Castell"), ("Quill Tower", "architect", "Oskar Veldt"),
    ("Amber Line Railway", "founder", "Rosa Ekholm"), ("Thornwick", "capital", "Calder Ford"),
]
PASSAGE = {"capital": "{e} is a small country in the north. Its capital city is {a}, on the river Ost.",
           "founder": "{e} is an organisation founded by {a}, who led it for twenty years.",
           "architect": "{e} is a landmark of the old town, designed by the architect {a}."}
QUESTION = {"capital": "What is the capital of {e}?", "founder": "Who founded {e}?", "architect": "Who designed {e}?"}
FILLER = ["weather", "rivers", "hills", "farming", "trade", "music", "bridges", "roads", "forests", "winters"]
SPLITS = {"my_train.jsonl": range(0, 8), "my_dev.jsonl": range(8, 12), "my_test.jsonl": range(12, 16)}

# What the test adds to the page's commands: the tiny random model and a 2-step run, per recipe.
TINY = {
    "search_r1_grpo": ["model.dtype=float32", "model.lora_layers=null", "steps=2", "questions_per_step=2",
                       "rollout.n=2", "save_every=1", "data.eval_n=2", "sft.steps=2", "sft.batch_size=2",
                       "algo.minibatch_size=4", "algo.micro_batch_size=2", "rollout.max_turns=2",
                       "rollout.max_turn_tokens=16", "rollout.max_response_tokens=48"],
    # the page says why: few, easy questions leave every group's reward flat
    "harr_grpo": ["steps=2", "questions_per_step=2", "save_every=1", "eval_every=1", "data.eval_n=2",
                  "retriever.pool=8", "retriever.filter_questions=false"],
}


def blocks(lang: str) -> list[str]:
    return [body for kind, body in re.findall(r"^```(\w*)\n(.*?)^```", DOC.read_text(), re.S | re.M) if kind == lang]


def doc_commands() -> list[list[str]]:
    """Every `ragrl ...` line of the page's bash blocks (backslash continuations joined), without `ragrl`."""
    lines = [line.strip() for body in blocks("bash") for line in body.replace("\\\n", " ").splitlines()]
    return [shlex.split(line)[1:] for line in lines if line.startswith("ragrl ")]


def write_data(root: Path) -> int:
    """The corpus (wiki-18 layout, numeric ids) and the three question files (FlashRAG's golden_answers);
    returns the number of passages."""
    rows = [{"id": i, "contents": f'"{e}"\n' + PASSAGE[kind].format(e=e, a=a)} for i, (e, kind, a) in enumerate(FACTS)]
    rows += [{"id": len(FACTS) + j, "contents": f'"Notes on {topic} {j}"\nA short note, number {j}, about {topic} '
              f"and the people who write about {topic} in the almanac."} for j, topic in enumerate(FILLER * 3)]
    (root / "my_corpus.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    for name, part in SPLITS.items():
        (root / name).write_text("".join(
            json.dumps({"id": f"q{i}", "question": QUESTION[FACTS[i][1]].format(e=FACTS[i][0]),
                        "golden_answers": [FACTS[i][2]], "gold_passage_ids": [str(i)]}) + "\n" for i in part))
    return len(rows)


def write_field_files(faiss_file: str, corpus_file: str) -> None:
    """Search-R1's released files in miniature: the page's corpus (already in their `contents` layout)
    and a flat inner-product index of "passage: "-prefixed, normalised vectors, row i = line i."""
    shutil.copyfile("my_corpus.jsonl", corpus_file)
    rows = [json.loads(line) for line in Path(corpus_file).read_text().splitlines()]
    vectors = load_embedder("all-minilm-l6-v2").encode([f"passage: {r['contents']}" for r in rows],
                                                       normalize_embeddings=True).astype("float32")
    index = faiss.IndexFlatIP(vectors.shape[1])
    index.add(vectors)
    faiss.write_index(index, faiss_file)


def invoke(args: list[str]) -> str:
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, f"ragrl {shlex.join(args)}\n{result.output}\n{result.exception!r}"
    return result.output


@pytest.fixture(scope="module")
def walkthrough(tmp_path_factory, tiny_model_dir):
    """The page's commands run in order in a fresh folder; (folder, passages, [(command, output)])."""
    root = tmp_path_factory.mktemp("own-data")
    passages = write_data(root)
    done = []
    with contextlib.chdir(root):
        for args in doc_commands():
            args = list(args)
            if args[0] == "train":
                sets = TINY[args[1]] + ([f"model.name={tiny_model_dir}"] if args[1] != "harr_grpo" else [])
                args += [x for s in sets for x in ("--set", s)]
            elif args[0] == "compare":
                args += ["--reader", str(tiny_model_dir)]
            if "--vectors" in args:   # vectors the user already has: here, the encoder's, from the dense index
                shutil.copyfile("my_dense_index/dense/embeddings.npy", args[args.index("--vectors") + 1])
            if args[:2] == ["index", "import"]:
                args[args.index("--encoder") + 1] = "all-minilm-l6-v2"
                write_field_files(args[args.index("--faiss") + 1], args[args.index("--corpus") + 1])
            done.append((args, invoke(args)))
    return root, passages, done


def test_the_json_examples_load_as_the_page_says(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    corpora = questions = 0
    for i, body in enumerate(blocks("jsonl")):
        path = tmp_path / f"example{i}.jsonl"
        path.write_text(body)
        if "question" in json.loads(body.splitlines()[0]):
            rows = load_questions(path)
            assert [r["answers"] for r in rows] == [["Zorvath"], ["Lena Quist"]]
            assert rows[0]["gold_passage_ids"] == ["0"] and "gold_passage_ids" not in rows[1]
            questions += 1
        else:
            corpus = load_corpus(path)
            assert corpus.titles == ["Quenland", "Saltmere Bridge"] and corpus.texts[0].startswith("Quenland is")
            corpora += 1
    assert (corpora, questions) == (2, 1)
    [row] = [json.loads(body) for body in blocks("json")]   # the Search-R1 / verl row, written as parquet
    pq.write_table(pa.Table.from_pylist([row]), tmp_path / "search_r1.parquet")
    [sample] = load_questions(tmp_path / "search_r1.parquet")
    assert sample["question"] == "What is the capital of Quenland?" and sample["answers"] == ["Zorvath"]


def test_every_command_of_the_page_runs_and_writes_what_it_says(walkthrough):
    root, passages, done = walkthrough
    ran = [" ".join(a[:2]) if a[0] in ("index", "train") else a[0] for a, _ in done]
    for step in ("index build", "index import", "search", "train search_r1_grpo", "train harr_grpo", "eval", "compare",
                 "view"):
        assert step in ran, f"docs/own_data.md no longer shows `ragrl {step}`"
    outputs = {shlex.join(a): out for a, out in done}
    assert any("--check" in a for a, _ in done)

    for folder, kind in (("my_index", "bm25"), ("my_dense_index", "dense")):
        manifest = json.loads((root / folder / "manifest.json").read_text())
        assert manifest["rows"] == passages and manifest["kind"] == kind
    imported = json.loads((root / "wiki18_e5" / "manifest.json").read_text())
    assert imported["rows"] == passages and imported["params"]["query_prefix"] == "query: "
    assert imported["params"]["passages_as"] == {"rendering": "contents", "prefix": "passage: "}
    search = next(out for cmd, out in outputs.items() if cmd.startswith("search "))
    assert "Quenland" in search and "Zorvath" in search

    check = next(out for cmd, out in outputs.items() if "--check" in cmd)
    assert "nothing was trained" in check
    # the warm start's gold passages are looked up in the index's corpus (the user's file, which the
    # index names and does not copy), not the bundled one
    assert "SFT warm start: 8 training questions with gold passages (8 of 8 ids in my_corpus.jsonl)" in check

    for run, artifact, index in (("my_run", "final_adapter", "my_index"),
                                 ("my_harr", "best_encoder", "my_dense_index")):
        run_dir = root / "runs" / run
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        assert [r.get("step") for r in rows] == [0, 1], run     # one row per RL step
        data = yaml.safe_load((run_dir / "config.yaml").read_text())["data"]
        assert (data["train"], data["eval"], data["index"]) == ("my_train.jsonl", "my_dev.jsonl", index)
        assert (run_dir / artifact).is_dir() and (run_dir / "training.json").is_file()
    assert (root / "runs/my_run/sft/adapter/adapter_config.json").is_file()

    report = json.loads((root / "runs/my_eval/report.json").read_text())
    assert report["meta"]["n"] == 4 and report["meta"]["data_file"] == "my_test.jsonl"
    assert set(report["systems"]) == {"direct", "naive_rag", "search_r1"}
    retrieval = json.loads((root / "runs/my_harr_eval/retrieval.json").read_text())
    assert retrieval["trained encoder"]["n"] == retrieval["index encoder"]["n"] == 4

    table = json.loads((root / "runs/my_compare/compare.json").read_text())
    assert set(table["rows"]) == {"direct", "naive_rag", "my_run (start)", "my_run", "my_harr (start)", "my_harr"}
    assert all(row["n"] == 4 for row in table["rows"].values())
    assert table["meta"]["index"] == "my_index" and f"({passages} passages" in table["meta"]["corpus"]
    assert "| my_run (start) | search_r1 |" in (root / "runs/my_compare/compare.md").read_text()
    assert (root / "runs/my_compare/view.html").stat().st_size > 1000


def test_compare_without_index_searches_the_one_the_run_searched(walkthrough, tiny_model_dir):
    root, passages, _ = walkthrough
    with contextlib.chdir(root):
        invoke(["compare", "runs/my_run", "--data", "my_test.jsonl", "--reader", str(tiny_model_dir),
                "--no-start", "--out", "runs/my_compare_default"])
    table = json.loads((root / "runs/my_compare_default/compare.json").read_text())
    assert table["meta"]["index"] == "my_index" and set(table["rows"]) == {"direct", "naive_rag", "my_run"}


def test_check_refuses_a_warm_start_without_gold_passages(walkthrough):
    root, _, _ = walkthrough
    rows = [json.loads(line) for line in (root / "my_train.jsonl").read_text().splitlines()]
    (root / "no_gold.jsonl").write_text("".join(json.dumps({k: v for k, v in r.items() if k != "gold_passage_ids"})
                                                + "\n" for r in rows))
    base = ["train", "search_r1_grpo", "--variant", "tiny", "--check", "--set", "data.eval=my_dev.jsonl",
            "--set", "out_dir=runs/never"]
    with contextlib.chdir(root):
        for extra, message in ((["data.train=no_gold.jsonl", "data.index=my_index"], "--set sft.steps=0"),
                               (["data.train=my_train.jsonl"], "none of the 8 gold_passage_ids")):
            result = CliRunner().invoke(app, base + [x for s in extra for x in ("--set", s)])
            assert result.exit_code != 0 and message in str(result.exception) + result.output, result.output
        ok = invoke(base + ["--set", "data.train=no_gold.jsonl", "--set", "data.index=my_index",
                            "--set", "sft.steps=0"])
    assert "nothing was trained" in ok and not (root / "runs/never").exists()
