"""Shared test setup: everything runs offline (no model/data hub), one thread per op."""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def smollm2_path():
    """The converted SmolLM2 directory (converted once per machine under ragrl_home())."""
    from ragrl.models.lm_weights import resolve_policy

    return resolve_policy("smollm2-135m-instruct")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, smollm2_path):
    """A tiny random Llama (seed 0) with SmolLM2's tokenizer, saved so it loads by path."""
    from ragrl.models.tiny import make_tiny_model

    out_dir = tmp_path_factory.mktemp("tiny-model")
    make_tiny_model(out_dir)
    return out_dir


@pytest.fixture(scope="session")
def smollm2_policy():
    """(model, tokenizer) of the real SmolLM2, loaded once per session (eval mode, float32, CPU)."""
    from ragrl.models.lm_weights import load_policy

    return load_policy("smollm2-135m-instruct")


@pytest.fixture(scope="session")
def demo_bm25_dir(tmp_path_factory):
    """A real BM25 index over the bundled demo corpus, built once per session (~1 s)."""
    from ragrl.paths import DEMO_CORPUS
    from ragrl.retrieval.index import build_index

    return build_index(DEMO_CORPUS, tmp_path_factory.mktemp("demo-bm25") / "index", kind="bm25", progress=False)


@pytest.fixture(scope="session")
def demo_bm25_index(demo_bm25_dir):
    """The demo BM25 index, loaded once per session."""
    from ragrl.retrieval.index import load_index

    return load_index(demo_bm25_dir)


@pytest.fixture(scope="session")
def small_dense_dir(tmp_path_factory):
    """A real MiniLM dense index over the demo questions' context passages (~200), for HARR recipes."""
    import json

    from ragrl.datasets import load_questions
    from ragrl.paths import DEMO_CORPUS
    from ragrl.retrieval.corpus import load_corpus
    from ragrl.retrieval.index import build_index

    root = tmp_path_factory.mktemp("dense")
    wanted = {pid for q in load_questions("demo-train")[:12] for pid in q.get("context_passage_ids") or []}
    corpus = load_corpus(DEMO_CORPUS)
    rows = [{"id": corpus.ids[i], "title": corpus.titles[i], "text": corpus.texts[i]}
            for i in range(len(corpus)) if corpus.ids[i] in wanted]
    path = root / "corpus.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return build_index(path, root / "index", kind="dense", progress=False)
