"""Fixtures the rollout tests share."""
import pytest

from ragrl.retrieval.resolve import make_retriever


@pytest.fixture(scope="module")
def index(demo_bm25_dir):
    """A retriever over the session's demo BM25 index."""
    return make_retriever(demo_bm25_dir)
