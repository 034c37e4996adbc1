"""HARR: the retriever as the policy. Real MiniLM query encoder, a real faiss dense index over a
small slice of the demo corpus (the context paragraphs of a few demo questions), real CLI runs.
"""
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from ragrl.datasets import load_questions
from ragrl.errors import ConfigError, IndexMismatchError
from ragrl.models.query_encoder import QueryEncoder
from ragrl.policy.retriever import RetrieverPolicy, collate_retrievals
from ragrl.retrieval.stochastic import QueryRequest, StochasticRetriever
from ragrl.rollout.config import RolloutConfig
from ragrl.rollout.retrieval_only import run_retrieval_episodes
from ragrl.train.run_dir import read_metrics

HERE = Path(__file__).resolve().parent
N_QUESTIONS = 12


def write_jsonl(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def kit(tmp_path_factory):
    """Questions, a corpus of their context paragraphs (~120 passages) and a dense index of it."""
    from ragrl.paths import DEMO_CORPUS
    from ragrl.retrieval.corpus import load_corpus
    from ragrl.retrieval.index import build_index, load_index

    root = tmp_path_factory.mktemp("harr")
    questions = [q for q in load_questions("demo-eval") if q.get("gold_passage_ids")][:N_QUESTIONS]
    wanted = {pid for q in questions for pid in q["context_passage_ids"]}
    corpus = load_corpus(DEMO_CORPUS)
    rows = [{"id": corpus.ids[i], "title": corpus.titles[i], "text": corpus.texts[i]}
            for i in range(len(corpus)) if corpus.ids[i] in wanted]
    corpus_path = write_jsonl(root / "corpus.jsonl", rows)
    index_dir = build_index(corpus_path, root / "dense", kind="dense", progress=False)
    write_jsonl(root / "train.jsonl", questions)
    return {"root": root, "questions": questions, "corpus": corpus_path, "index_dir": index_dir,
            "dense": load_index(index_dir).backend}


@pytest.fixture(scope="module")
def sampler(kit):
    return StochasticRetriever(kit["dense"], QueryEncoder("all-minilm-l6-v2"), pool=10, temperature=0.05)


def test_deterministic_mode_is_exactly_faiss_top_k_of_the_index(kit, sampler):
    queries = [q["question"] for q in kit["questions"]] + ["   "]
    got = sampler.search(queries, 3)
    want = kit["dense"].search(queries[:-1], 3)
    assert [[h.id for h in hs] for hs in got[:-1]] == [[h.id for h in hs] for hs in want]
    assert got[-1] == []   # a blank query gets nothing, as in every other retriever


def test_sampled_log_prob_is_what_the_policy_recomputes_and_ratio_starts_at_one(kit, sampler):
    g = torch.Generator().manual_seed(0)
    trajs, _ = run_retrieval_episodes(sampler, kit["questions"][:3], RolloutConfig(n=4, topk=3, seed=1))
    assert len(trajs) == 12 and all(len(t.retrievals) == 1 for t in trajs)
    assert [t.group for t in trajs] == [0] * 4 + [1] * 4 + [2] * 4
    a = trajs[0].retrievals[0]
    assert len(a.candidate_rows) == 10 and len(set(a.sampled)) == 3
    assert trajs[0].turns[0].passage_ids[0] == [a.candidate_ids[p] for p in a.sampled]
    policy = RetrieverPolicy(sampler.encoder, sampler.embeddings, 0.05)
    batch = collate_retrievals(trajs)
    out = policy.forward(batch)
    assert torch.allclose(out["logprobs"], batch.old_logprobs, atol=1e-4)
    # selecting rows keeps each row's own actions
    sub = batch.select([5, 0])
    assert torch.allclose(policy.forward(sub)["logprobs"][:, 0], batch.old_logprobs[[5, 0], 0], atol=1e-4)
    del g


def test_a_group_embeds_its_text_once_and_still_draws_independently(kit):
    class Counting:
        def __init__(self, enc):
            self.enc, self.texts = enc, []

        def encode(self, texts):
            self.texts += list(texts)
            return self.enc.encode(texts)

    enc = Counting(QueryEncoder("all-minilm-l6-v2"))
    sampler = StochasticRetriever(kit["dense"], enc, pool=10, temperature=0.5)
    qs = kit["questions"][:2]
    trajs, _ = run_retrieval_episodes(sampler, qs, RolloutConfig(n=8, topk=3, seed=0))
    assert sorted(enc.texts) == sorted(q["question"] for q in qs)      # 2 encodings, not 16
    draws = {tuple(t.retrievals[0].sampled) for t in trajs if t.group == 0}
    assert len(draws) > 1                                                # n draws, not one copied
    # every draw's recorded log-prob is its own (the policy recomputes each one)
    policy = RetrieverPolicy(enc.enc, sampler.embeddings, 0.5)
    batch = collate_retrievals(trajs)
    assert torch.allclose(policy.forward(batch)["logprobs"], batch.old_logprobs, atol=1e-4)


def test_two_hop_episode_embeds_what_hop_one_found_and_never_draws_it_again(kit):
    sampler = StochasticRetriever(kit["dense"], QueryEncoder("all-minilm-l6-v2"), pool=10, temperature=0.5,
                                  history_words=5)
    qs = kit["questions"][:2]
    trajs, _ = run_retrieval_episodes(sampler, qs, RolloutConfig(n=4, topk=3, seed=0), hops=2)
    assert len(trajs) == 8 and all(len(t.retrievals) == 2 and t.num_searches == 2 for t in trajs)
    for t in trajs:
        first, second = t.retrievals
        assert first.query_text == t.question                                  # hop 1: the plain question
        assert second.query_text.startswith(f"{t.question}\nFound: ")         # hop 2: question + what hop 1 drew
        assert all(title in second.query_text for title in t.turns[0].passage_titles[0])
        assert not set(first.candidate_rows[p] for p in first.sampled) & set(second.candidate_rows)
        assert len(second.candidate_rows) == 10
        assert len(set(t.retrieved_ids)) == 6
    policy = RetrieverPolicy(sampler.encoder, sampler.embeddings, 0.5)
    batch = collate_retrievals(trajs)
    assert batch.action_mask.shape == (8, 2)
    assert torch.allclose(policy.forward(batch)["logprobs"], batch.old_logprobs, atol=1e-4)


def test_shared_first_hops_make_a_tree_and_every_hop_gets_a_gradient(kit):
    """history_branches=2: each half of a group shares its first hop (so the second hop embeds at
    most 2 histories per question), the second hops are each trajectory's own, and both hops'
    log-probs reach the encoder's weights."""
    encoder = QueryEncoder("all-minilm-l6-v2")
    sampler = StochasticRetriever(kit["dense"], encoder, pool=10, temperature=1.0)
    qs = kit["questions"][:3]
    trajs, _ = run_retrieval_episodes(sampler, qs, RolloutConfig(n=8, topk=3, seed=0), hops=2, history_branches=2)
    for g in range(3):
        group = trajs[8 * g:8 * g + 8]
        for block in (group[:4], group[4:]):
            assert len({tuple(t.turns[0].passage_ids[0]) for t in block}) == 1
            assert len({t.retrievals[1].query_text for t in block}) == 1
        assert len({tuple(t.turns[1].passage_ids[0]) for t in group}) > 2     # last hops drawn per trajectory
        assert len({t.retrievals[1].query_text for t in group}) <= 2
    policy = RetrieverPolicy(encoder, sampler.embeddings, 1.0)
    batch = collate_retrievals(trajs)
    assert torch.allclose(policy.forward(batch)["logprobs"], batch.old_logprobs, atol=1e-4)
    weight = encoder.st[0].auto_model.encoder.layer[0].attention.self.query.weight
    for hop in range(2):
        encoder.zero_grad()
        policy.forward(batch)["logprobs"][:, hop].sum().backward()
        assert weight.grad is not None and float(weight.grad.abs().sum()) > 0, hop


def test_deterministic_hops_extend_top_k_with_passages_not_found_yet(kit):
    enc = QueryEncoder("all-minilm-l6-v2")
    with_history = StochasticRetriever(kit["dense"], enc, pool=10, temperature=0.05)
    plain = StochasticRetriever(kit["dense"], enc, pool=10, temperature=0.05, history=False)
    qs = [q["question"] for q in kit["questions"][:5]]
    one, six = with_history.search(qs, 3), with_history.search(qs, 6)
    hopped, flat = with_history.search_hops(qs, 3, 2), plain.search_hops(qs, 3, 2)
    for a, h, f, s6 in zip(one, hopped, flat, six):
        assert [x.id for x in h[:3]] == [x.id for x in a] and len({x.id for x in h}) == 6
        assert [x.id for x in f] == [x.id for x in s6]     # no history: hop 2 is ranks 4-6 of the question
    assert any([x.id for x in h] != [x.id for x in f] for h, f in zip(hopped, flat))


def test_gradients_reach_the_encoder_and_never_the_passage_vectors(kit):
    encoder = QueryEncoder("all-minilm-l6-v2")
    sampler = StochasticRetriever(kit["dense"], encoder, pool=10, temperature=0.05)
    before_vectors = sampler.embeddings.clone()
    before_index = kit["dense"].embeddings.copy()
    trajs, _ = run_retrieval_episodes(sampler, kit["questions"][:2], RolloutConfig(n=2, topk=3, seed=0))
    policy = RetrieverPolicy(encoder, sampler.embeddings, 0.05)
    out = policy.forward(collate_retrievals(trajs))
    out["logprobs"].sum().backward()
    grads = [p.grad for p in encoder.parameters() if p.requires_grad]
    assert any(g is not None and float(g.abs().sum()) > 0 for g in grads)
    assert not sampler.embeddings.requires_grad and sampler.embeddings.grad is None
    torch.optim.SGD(encoder.parameters(), lr=1.0).step()
    assert torch.equal(sampler.embeddings, before_vectors)
    assert np.array_equal(kit["dense"].embeddings, before_index)


def test_a_lora_encoder_trains_only_its_adapter_and_saves_merged(kit, tmp_path):
    from sentence_transformers import SentenceTransformer

    encoder = QueryEncoder("all-minilm-l6-v2", lora=True, lora_r=4)
    trainable = [n for n, p in encoder.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    texts = ["who directed jaws", "capital of france"]
    base = encoder.encode(texts)
    with torch.no_grad():   # a trained adapter: B is no longer zero
        for n, p in encoder.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.05, generator=torch.Generator().manual_seed(0))
    trained = encoder.encode(texts)
    assert not np.allclose(trained, base, atol=1e-4)
    saved = SentenceTransformer(str(encoder.save_encoder(tmp_path / "enc")), device="cpu")
    reloaded = saved.encode(texts, normalize_embeddings=True)
    np.testing.assert_allclose(reloaded, trained, atol=1e-5)
    assert not any("lora" in k for k in saved.state_dict())   # a plain folder: LoRA merged
    np.testing.assert_allclose(encoder.encode(texts), trained, atol=1e-6)   # the live encoder untouched


def test_follow_up_search_embeds_question_and_history(kit):
    """With a generator in the loop, every search is a sampled action, and the second search's
    text carries the original question and what the first one found."""
    from ragrl.rollout.protocol import get_protocol
    from ragrl.models.lm_weights import load_policy
    from ragrl.rollout.multi_turn import run_episodes
    from tests.rollout.scripted import ScriptedEngine

    _, tok = load_policy("smollm2-135m-instruct")
    protocol = get_protocol("search_r1")
    q = kit["questions"][0]["question"]
    engine = ScriptedEngine(tok, protocol, {q: ["<search> first hop </search>", "<search> second hop </search>",
                                                "<answer> x </answer>"]})
    sampler = StochasticRetriever(kit["dense"], QueryEncoder("all-minilm-l6-v2"), pool=10, temperature=0.05)
    trajs, _ = run_episodes(engine, protocol, sampler, [kit["questions"][0]], RolloutConfig(n=1, max_turns=3, seed=0))
    acts = trajs[0].retrievals
    assert len(acts) == 2
    assert acts[0].query_text.startswith(f"Original Question: {q}") and acts[0].query_text.endswith("Query: first hop")
    assert '"sub_query": "first hop"' in acts[1].query_text
    assert trajs[0].turns[0].passage_titles[0][0] in acts[1].query_text
    off = StochasticRetriever(kit["dense"], sampler.encoder, pool=10, temperature=0.05, history=False)
    assert off.text(QueryRequest(q, "second hop", [{"sub_query": "first hop"}])) == "second hop"


def test_grpo_on_gold_recall_raises_recall_on_its_training_questions(kit, tmp_path):
    """A few steps of real GRPO (the Trainer, the tiny recipe) move deterministic recall@3 up."""
    from ragrl.train.recipe import load_train_config
    from ragrl.train.trainer import Trainer

    cfg = load_train_config("harr_grpo", [
        f"data.index={kit['index_dir']}", f"data.train={kit['root'] / 'train.jsonl'}",
        f"data.eval={kit['root'] / 'train.jsonl'}", f"data.eval_n={N_QUESTIONS}", "steps=12", "eval_every=0",
        "keep_best=null",
        "questions_per_step=6", "lr=3e-4", "retriever.pool=10", "retriever.temperature=0.1",
        "retriever.filter_questions=false", f"out_dir={tmp_path / 'run'}", "save_every=100"], variant="tiny")
    trainer = Trainer(cfg)
    before = trainer.evaluate()["recall"]
    trainer.train(progress=False)
    after = trainer.evaluate()["recall"]
    assert after > before + 2.0, (before, after)
    assert (tmp_path / "run" / "final_encoder" / "modules.json").exists()
    assert (tmp_path / "run" / "config.yaml").read_text().count("policy: retriever") == 1


def test_ppo_value_head_learns_the_reward_scale(kit, tmp_path):
    from ragrl.train.recipe import load_train_config
    from ragrl.train.trainer import Trainer

    cfg = load_train_config("harr_ppo", [
        f"data.index={kit['index_dir']}", f"data.train={kit['root'] / 'train.jsonl'}", "steps=6",
        "eval_every=0", "keep_best=null", "questions_per_step=6", "lr=1e-3", "retriever.pool=10", "retriever.filter_questions=false",
        f"out_dir={tmp_path / 'ppo'}", "save_every=100"], variant="tiny")
    rows = Trainer(cfg).train(progress=False)
    assert rows[-1]["value_loss"] < rows[0]["value_loss"]


def test_a_lexical_index_or_other_encoder_is_refused_before_any_rollout(kit, tmp_path, demo_bm25_dir):
    from ragrl.train.recipe import load_train_config
    from ragrl.train.trainer import Trainer

    base = [f"data.train={kit['root'] / 'train.jsonl'}", f"out_dir={tmp_path / 'x'}"]
    with pytest.raises(ConfigError, match="dense or hybrid index"):
        Trainer(load_train_config("harr_grpo", base + [f"data.index={demo_bm25_dir}"], variant="tiny"))
    with pytest.raises(ConfigError, match="retriever.encoder"):
        Trainer(load_train_config("harr_grpo", base + [f"data.index={kit['index_dir']}",
                                                       "retriever.encoder=bert-base-uncased"], variant="tiny"))
    assert not (tmp_path / "x" / "metrics.jsonl").exists()


def test_index_from_precomputed_vectors_is_checked_against_corpus_and_encoder(kit, tmp_path):
    from ragrl.retrieval.index import build_index, load_index

    vectors = kit["dense"].embeddings.astype(np.float16)
    good = tmp_path / "good.npy"
    np.save(good, vectors)
    out = build_index(kit["corpus"], tmp_path / "from_vectors", kind="dense", vectors=good, progress=False)
    idx = load_index(out)
    q = [x["question"] for x in kit["questions"]]
    assert [[h.id for h in hs] for hs in idx.search(q, 3)] == [[h.id for h in hs] for hs in kit["dense"].search(q, 3)]
    np.save(tmp_path / "short.npy", vectors[:-1])
    with pytest.raises(IndexMismatchError, match="vectors for a corpus of"):
        build_index(kit["corpus"], tmp_path / "bad1", kind="dense", vectors=tmp_path / "short.npy", progress=False)
    np.save(tmp_path / "shuffled.npy", vectors[::-1].copy())
    with pytest.raises(IndexMismatchError, match="another corpus order or encoder"):
        build_index(kit["corpus"], tmp_path / "bad2", kind="dense", vectors=tmp_path / "shuffled.npy", progress=False)
    assert not (tmp_path / "bad1").exists() and not (tmp_path / "bad2").exists()


def test_killed_encoder_run_resumes_to_the_uninterrupted_metrics(kit, tmp_path):
    """SIGKILL while checkpoint 4 is being written; --resume from step 2 replays steps 2-3 exactly,
    the weight average (ema_decay) included: the exported encoders are the same average."""
    import signal
    import time

    from safetensors.torch import load_file

    sets = {"data.index": kit["index_dir"], "data.train": kit["root"] / "train.jsonl", "steps": 4,
            "save_every": 2, "questions_per_step": 4, "rollout.n": 4, "retriever.pool": 10, "eval_every": 0,
            # the tiny recipe's two hops (a tree of 2 branches) over ~120 passages: a warmer draw keeps
            # every step's groups from going flat, so each step's gradient differs
            "retriever.temperature": 0.5,
            "keep_best": "null", "ema_decay": 0.5,
            "lr": 3e-4, "seed": 3}
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "RAGRL_HOME": str(tmp_path / "home")}

    def cmd(out, resume=False, worker=False):
        entry = [str(HERE.parent / "train" / "train_worker.py")] if worker else ["-m", "ragrl.cli.main"]
        args = [a for k, v in {**sets, "out_dir": out}.items() for a in ("--set", f"{k}={v}")]
        return [sys.executable, *entry, "train", "harr_grpo", "--variant", "tiny", *args] + (["--resume"] if resume else [])

    subprocess.run(cmd(tmp_path / "clean"), env=env, check=True, capture_output=True, timeout=300)
    want = read_metrics(tmp_path / "clean")
    ready = tmp_path / "ready"
    proc = subprocess.Popen(cmd(tmp_path / "killed", worker=True), start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env={**env, "RAGRL_TEST_HANG_AT_CHECKPOINT": "4",
                                                            "RAGRL_TEST_READY": str(ready)})
    deadline = time.monotonic() + 300
    while not ready.exists():
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    assert (tmp_path / "killed" / "checkpoints" / "latest").read_text().strip() == "step_000002"
    subprocess.run(cmd(tmp_path / "killed", resume=True), env=env, check=True, capture_output=True, timeout=300)
    got = read_metrics(tmp_path / "killed")
    assert [r["step"] for r in got] == [0, 1, 2, 3]
    assert len({round(r["grad_norm"], 6) for r in want}) == 4   # the steps differ, so equality means something
    for g, w in zip(got, want):
        for k in ("reward_mean", "gold_recall", "grad_norm", "pg_loss", "loss"):
            assert math.isclose(g[k], w[k], rel_tol=1e-4, abs_tol=1e-6), (w["step"], k, g[k], w[k])
    kept = json.loads((tmp_path / "killed" / "kept_questions.json").read_text())
    assert kept == json.loads((tmp_path / "clean" / "kept_questions.json").read_text())
    assert 0 < len(kept["kept"]) <= kept["total"] == N_QUESTIONS
    exported = [load_file(tmp_path / run / "final_encoder" / "model.safetensors") for run in ("clean", "killed")]
    online = load_file(tmp_path / "clean" / "checkpoints" / "step_000004" / "model.safetensors")
    name = "encoder.layer.0.attention.self.query.weight"
    assert torch.allclose(exported[0][name], exported[1][name], atol=1e-6)
    assert not torch.allclose(exported[0][name], online[f"st.0.model.{name}"], atol=1e-6)   # the average, not the last step


def test_retriever_quickstart_end_to_end_on_a_small_index(kit, tiny_model_dir, tmp_path, monkeypatch):
    """The main job's stages on the small index: before / after tables with paired differences,
    the encoder kept on the held-apart questions, curves; held-out questions never train."""
    from ragrl.quickstart.retriever_job import run_retriever_quickstart

    monkeypatch.setenv("RAGRL_HOME", str(tmp_path / "home"))
    questions = kit["questions"]
    test = write_jsonl(tmp_path / "test.jsonl", questions[:3])
    test2 = write_jsonl(tmp_path / "test2.jsonl", questions[3:6])
    train = write_jsonl(tmp_path / "train.jsonl", questions[6:])
    sets = [f"data.index={kit['index_dir']}", f"data.train={train}", f"data.eval={train}", "data.eval_n=6",
            f"model.name={tiny_model_dir}", "model.dtype=float32", "steps=4", "eval_every=2", "keep_best=recall",
            "questions_per_step=3", "retriever.pool=10", "lr=3e-4", "retriever.hops=2", "retriever.history_branches=2"]
    report = run_retriever_quickstart(str(tmp_path / "qs"), sets, minutes=None, downstream_n=2,
                                      test_sets={"small": str(test), "small2": str(test2)})
    small = report["sets"]["small"]
    assert set(small["retrieval"]["paired"]["RL encoder"]) == {"recall", "answer_at_k"}
    assert small["downstream_n"] == 2 and 0 <= small["downstream_regenerated"] <= 2
    # the primary endpoint pools every held-out question of every set
    assert report["pooled"]["sets"] == ["small", "small2"] and report["pooled"]["base encoder"]["n"] == 6
    assert set(report["pooled"]["paired"]["RL encoder"]) == {"recall", "answer_at_k"}
    assert report["settings"]["steps"] == 4 and report["settings"]["best"]["step"] in (2, 4)
    md = (tmp_path / "qs" / "before_after.md").read_text()
    # two hops of 3: the reader is given 6, and the base encoder searches the same two hops
    assert "gold recall@6" in md and "RL encoder" in md and "Δ vs base encoder" in md
    assert all(len(row["hits"]) == 6 for row in report["pooled"]["base encoder"].get("per_question", {}).values())
    assert "Hop that first brought the answer" in md and "answer@6 base → RL (questions gained / lost)" in md
    shares = report["pooled"]["first_gold_hop"]["base encoder"]
    assert len(shares) == 2 and 0 <= sum(shares) <= 100.0 + 1e-9
    assert "all held-out questions, pooled (6: small, small2)" in md
    assert (tmp_path / "qs" / "training_curves.png").stat().st_size > 0
    assert (tmp_path / "qs" / "rl" / "best_encoder" / "modules.json").exists()
    trained_on = {r["id"] for r in map(json.loads, train.read_text().splitlines())}
    assert not trained_on & {q["id"] for q in questions[:6]}


def test_eval_cli_compares_the_index_encoder_with_a_saved_query_encoder(kit, tmp_path):
    """`ragrl eval --systems retrieval --query-encoder DIR`: an encoder saved untrained retrieves
    exactly what the index's own encoder does (paired difference 0); a bad folder is refused."""
    enc_dir = QueryEncoder("all-minilm-l6-v2").save_encoder(tmp_path / "enc")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    base = [sys.executable, "-m", "ragrl.cli.main", "eval", "--systems", "retrieval", "--index", str(kit["index_dir"]),
            "--data", str(kit["root"] / "train.jsonl"), "--n", "8"]
    subprocess.run(base + ["--query-encoder", str(enc_dir), "--out", str(tmp_path / "ev")], env=env, check=True,
                   capture_output=True, timeout=300)
    res = json.loads((tmp_path / "ev" / "retrieval.json").read_text())
    assert res["index encoder"]["n"] == 8 and res["index encoder"]["recall"] == res["trained encoder"]["recall"]
    assert res["paired"]["trained encoder"]["recall"]["diff"] == 0.0
    assert res["changed"]["trained encoder"]["recall"] == {"gained": 0, "lost": 0}
    bad = subprocess.run(base + ["--query-encoder", str(tmp_path), "--out", str(tmp_path / "ev2")], env=env,
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode != 0 and "--query-encoder" in bad.stderr and "Traceback" not in bad.stderr


def test_eval_run_takes_the_trained_runs_own_settings(kit, tmp_path):
    """A two-hop run trains (both hops in every step's update); `ragrl eval --run RUN` then takes the
    index, the query encoder (best on the held-apart slice, else final), the hops and the history
    from the run, for the index's encoder and the trained one alike, and reports the k the reader
    is given (2 hops of 2) with the hop that first found a gold passage."""
    from ragrl.train.recipe import load_train_config
    from ragrl.train.trainer import Trainer

    run = tmp_path / "run"
    cfg = load_train_config("harr_grpo", [
        f"data.index={kit['index_dir']}", f"data.train={kit['root'] / 'train.jsonl'}", "steps=2", "eval_every=1",
        f"data.eval={kit['root'] / 'train.jsonl'}", "questions_per_step=4", "retriever.pool=10", "rollout.topk=2",
        "retriever.hops=2", "retriever.history_branches=2", "retriever.history_words=4",
        "retriever.filter_questions=false", f"out_dir={run}", "save_every=100"], variant="tiny")
    rows = Trainer(cfg).train(progress=False)
    assert all(r["grad_norm"] > 0 for r in rows) and rows[0]["eval/k"] == 4
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    subprocess.run([sys.executable, "-m", "ragrl.cli.main", "eval", "--run", str(run), "--systems", "retrieval",
                    "--data", str(kit["root"] / "train.jsonl"), "--n", "5", "--out", str(tmp_path / "ev")],
                   env=env, check=True, capture_output=True, timeout=300)
    res = json.loads((tmp_path / "ev" / "retrieval.json").read_text())
    assert res["settings"]["query_encoder"] == str(run / "best_encoder")
    assert res["settings"]["index"] == str(kit["index_dir"]) and res["settings"]["k"] == 4
    assert res["settings"]["hops"] == 2
    for system in ("index encoder", "trained encoder"):
        r = res[system]
        assert all(len(row["hits"]) == 4 for row in r["per_question"].values())
        first = [row["gold_hop"] for row in r["per_question"].values()]
        assert r["gold_hop1"] == 100 * first.count(1) / 5 and r["gold_hop2"] == 100 * first.count(2) / 5
    bad = subprocess.run([sys.executable, "-m", "ragrl.cli.main", "eval", "--run", str(tmp_path), "--out",
                          str(tmp_path / "ev2")], env=env, capture_output=True, text=True, timeout=300)
    assert bad.returncode != 0 and "not a ragrl training run directory" in bad.stderr


def test_a_time_budget_that_ends_before_the_first_evaluation_still_keeps_a_policy(kit, tmp_path, caplog):
    from ragrl.train.recipe import load_train_config
    from ragrl.train.trainer import Trainer

    run = tmp_path / "run"
    cfg = load_train_config("harr_grpo", [
        f"data.index={kit['index_dir']}", f"data.train={kit['root'] / 'train.jsonl'}", "steps=50", "eval_every=25",
        f"data.eval={kit['root'] / 'train.jsonl'}", "questions_per_step=2", "rollout.n=2", "retriever.pool=10",
        "retriever.filter_questions=false", f"out_dir={run}", "save_every=100"], variant="tiny")
    with caplog.at_level("WARNING", logger="ragrl.train"):
        rows = Trainer(cfg).train(progress=False, time_budget_s=1e-6)
    assert len(rows) == 1 and "eval/recall" in rows[0]
    assert "before the first evaluation (eval_every=25)" in caplog.text
    assert json.loads((run / "best.json").read_text())["step"] == 1
    assert (run / "best_encoder" / "modules.json").exists()
    assert read_metrics(run)[-1]["eval/at_time_budget"] == 1.0


def test_history_branches_are_refused_where_nothing_would_share_them(kit, tmp_path):
    from ragrl.train.check import check_combinations
    from ragrl.train.recipe import load_train_config

    def check(*sets):
        check_combinations(load_train_config("harr_grpo", [f"data.index={kit['index_dir']}", *sets], variant="tiny"))

    check("retriever.hops=2", "retriever.history_branches=2")
    with pytest.raises(ConfigError, match="retriever.hops > 1"):
        check("retriever.hops=1", "retriever.history_branches=2")
    with pytest.raises(ConfigError, match="retriever.hops > 1"):
        check("retriever.generator=smollm2-135m-instruct", "retriever.hops=1", "retriever.history_branches=2")
    with pytest.raises(ConfigError, match="divisor of rollout.n=8"):
        check("retriever.hops=2", "retriever.history_branches=3")
    with pytest.raises(ConfigError, match="history_words"):
        check("retriever.history_words=0")
