"""Question files: every malformed row is reported with its file and line number."""
import gzip

import pytest

from ragrl.datasets import load_questions
from ragrl.errors import RagrlError

GOOD = '{"id": "q1", "question": "Who?", "answers": ["Ann"]}'


@pytest.mark.parametrize("bad,message", [
    ('{"question": "Who?", "answers": [', "invalid JSON"),
    ('["Who?"]', "expected a JSON object, got list"),
    ('{"answers": ["Ann"]}', 'missing or empty "question"'),
    ('{"question": "Who?", "answers": []}', '"answers" (or "golden_answers") must be a non-empty list of strings'),
])
def test_malformed_row_names_file_and_line(tmp_path, bad, message):
    path = tmp_path / "q.jsonl"
    path.write_text(GOOD + "\n\n" + bad + "\n")
    with pytest.raises(RagrlError) as e:
        load_questions(path)
    assert f"{path}:3:" in str(e.value) and message in str(e.value)


def test_gzip_is_detected_by_content_and_answer_strings_become_lists(tmp_path):
    path = tmp_path / "renamed.jsonl"  # gzip bytes without the .gz suffix
    path.write_bytes(gzip.compress(b'{"question": "Who?", "answer": "Ann"}\n'))
    rows = load_questions(path)
    assert rows == [{"question": "Who?", "answer": "Ann", "answers": ["Ann"], "id": "renamed-1"}]


def test_invalid_utf8_and_empty_files_are_clear_errors(tmp_path):
    path = tmp_path / "q.jsonl"
    path.write_bytes(GOOD.encode() + b"\n\xff\xfe\n")
    with pytest.raises(RagrlError, match=r"q.jsonl:2: invalid UTF-8"):
        load_questions(path)
    path.write_text("\n")
    with pytest.raises(RagrlError, match="no questions"):
        load_questions(path)
    with pytest.raises(RagrlError, match="question file not found"):
        load_questions(tmp_path / "missing.jsonl")


def test_bundled_train_split_is_disjoint_from_the_held_out_questions():
    """The demo train file gained R1-Searcher questions: none may be a held-out question, and the
    added ones carry answer-bearing passages that exist in the bundled corpus."""
    from ragrl.paths import DEMO_CORPUS
    from ragrl.retrieval.corpus import load_corpus
    from ragrl.rewards.qa import normalize_answer

    train, held_out = load_questions("demo-train"), load_questions("demo-eval")
    assert len(train) == 913 and len(held_out) == 300
    assert not {normalize_answer(q["question"]) for q in train} & {normalize_answer(q["question"]) for q in held_out}
    assert not {q["id"] for q in train} & {q["id"] for q in held_out}
    corpus = load_corpus(DEMO_CORPUS)
    added = [q for q in train if q.get("gold_source") == "bm25_answer_match"]
    assert len(added) == 713
    for q in added[:50]:
        text = " ".join(normalize_answer(corpus.get(pid)["title"] + " " + corpus.get(pid)["text"])
                        for pid in q["gold_passage_ids"])
        assert any(normalize_answer(a) in text for a in q["answers"]), q["id"]


def test_flashrag_question_and_corpus_files_load(tmp_path):
    """FlashRAG's question rows (`golden_answers`) and its / Search-R1's corpus rows
    (`contents` = quoted title, newline, text; numeric ids) load like ragrl's own."""
    from ragrl.errors import CorpusError
    from ragrl.retrieval.corpus import load_corpus

    q = tmp_path / "nq.jsonl"
    q.write_text('{"id": "test_0", "question": "who directed jaws", "golden_answers": ["Steven Spielberg"]}\n')
    assert load_questions(q)[0]["answers"] == ["Steven Spielberg"]
    c = tmp_path / "wiki18.jsonl"
    c.write_text('{"id": 0, "contents": "\\"Jaws (film)\\"\\nJaws is a 1975 film by Steven Spielberg."}\n'
                 '{"id": "1", "contents": "\\"Peter Benchley\\"\\nAuthor of Jaws."}\n')
    corpus = load_corpus(c)
    assert corpus.ids == ["0", "1"] and corpus.titles == ["Jaws (film)", "Peter Benchley"]
    assert corpus.texts[0] == "Jaws is a 1975 film by Steven Spielberg."
    bad = tmp_path / "both.jsonl"
    bad.write_text('{"id": "0", "contents": "x", "title": "t", "text": "y"}\n')
    with pytest.raises(CorpusError, match="both.jsonl:1: a row has either"):
        load_corpus(bad)


def test_search_r1_parquet_and_a_saved_dataset_load(tmp_path):
    """Search-R1's / verl's parquet rows (the question in the chat prompt, answers in
    reward_model.ground_truth.target) and an Arrow dataset directory load as QA rows."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"data_source": "nq", "prompt": [{"role": "user", "content": "Answer the question. Question: who wrote jaws?\n"}],
             "reward_model": {"style": "rule", "ground_truth": {"target": ["Peter Benchley"]}}, "extra_info": {"index": 0}}]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "train.parquet")
    q = load_questions(tmp_path / "train.parquet")
    assert q[0]["question"] == "who wrote jaws?" and q[0]["answers"] == ["Peter Benchley"] and q[0]["dataset"] == "nq"
    d = tmp_path / "saved"
    d.mkdir()
    table = pa.Table.from_pylist([{"question": "q1", "golden_answers": ["a"]}, {"question": "q2", "golden_answers": ["b"]}])
    with pa.OSFile(str(d / "data-00000-of-00001.arrow"), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    assert [r["answers"] for r in load_questions(d)] == [["a"], ["b"]]
    (tmp_path / "bad.parquet").write_bytes(b"not parquet")
    with pytest.raises(RagrlError, match="bad.parquet: not a readable .parquet file"):
        load_questions(tmp_path / "bad.parquet")


def test_multihop_splits_hold_apart_every_family_and_mark_heuristic_evidence():
    """The retriever's train / held-apart splits: disjoint, every row has evidence ids (but the
    answer-only MuSiQue-train rows), 2Wiki's evidence is marked heuristic, and the held-apart split
    has each family the evaluation has."""
    from collections import Counter

    from ragrl.rewards.qa import normalize_answer

    train, dev = load_questions("multihop-train"), load_questions("multihop-dev")
    assert not {q["id"] for q in train} & {q["id"] for q in dev}
    assert not {normalize_answer(q["question"]) for q in train} & {normalize_answer(q["question"]) for q in dev}
    # MuSiQue's only rows with gold passages are held apart; training has MuSiQue-train questions
    # with answers only (issue #41), marked so, and every other row has evidence ids.
    answer_only = [q for q in train if q.get("gold_source") == "answer_only"]
    assert len(answer_only) == 600 and all(q["dataset"] == "musique" and not q.get("gold_passage_ids")
                                           for q in answer_only)
    assert all(q.get("gold_passage_ids") for q in train + dev if q not in answer_only)
    assert all((q.get("gold_source") == "heuristic_evidence") == (q["dataset"] == "2wikimultihopqa") for q in train + dev)
    assert Counter(q["dataset"] for q in dev) == {"hotpotqa": 200, "musique": 100, "2wikimultihopqa": 137}
    assert all(q in answer_only for q in train if q["dataset"] == "musique")
    assert {q["id"] for q in load_questions("pool-dev")} <= {q["id"] for q in dev}


def test_multihop_splits_share_no_question_with_the_kits_eval_files():
    from ragrl.datasets import with_heuristic_gold
    from ragrl.paths import data_kit
    from ragrl.rewards.qa import normalize_answer

    kit = data_kit()   # part of the project (./datakit, installed by install.sh): never skipped
    held_out = {normalize_answer(q["question"]) for p in (kit / "eval").glob("*.jsonl.gz") for q in load_questions(p)}
    mine = load_questions("multihop-train") + load_questions("multihop-dev")
    assert not {normalize_answer(q["question"]) for q in mine} & held_out
    wiki = with_heuristic_gold(load_questions(kit / "eval" / "2wikimultihopqa_dev.jsonl.gz"))
    assert all(q["gold_source"] == "heuristic_evidence" and q["gold_passage_ids"] for q in wiki)


@pytest.mark.parametrize("name,size", [("agent-dev", 200), ("agent-confirm", 364)])
def test_agent_splits_are_2wiki_no_search_agent_trains_on_and_no_eval_question(name, size):
    """`agent-dev` holds apart 200 2Wiki dev-pool questions for the search agents' selection rules
    once `pool-dev` was spent, and `agent-confirm` the other 364, to confirm what `agent-dev` chose:
    none in a search agent's training files, none yes/no (the search gain skips those), none an eval/
    question, and the two splits disjoint."""
    from ragrl.paths import data_kit
    from ragrl.rewards.qa import normalize_answer

    dev = load_questions(name)
    assert len(dev) == size and {q["dataset"] for q in dev} == {"2wikimultihopqa"}
    assert not any(normalize_answer(q["answers"][0]) in ("yes", "no") for q in dev)
    other = "agent-confirm" if name == "agent-dev" else "agent-dev"
    trained_on = {q["id"] for split in ("pool-train", "pool-dev", "smartrag-train", "demo-train", other)
                  for q in load_questions(split)}
    assert not {q["id"] for q in dev} & trained_on
    kit = data_kit()
    held_out = {normalize_answer(q["question"]) for p in (kit / "eval").glob("*.jsonl.gz") for q in load_questions(p)}
    assert not {normalize_answer(q["question"]) for q in dev} & held_out
