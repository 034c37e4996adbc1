"""Shared by the retrieval tests: the real MiniLM, loaded once a session."""
import pytest

from ragrl.models.embedder import load_embedder


@pytest.fixture(scope="session")
def minilm():
    return load_embedder("all-minilm-l6-v2")  # load_embedder also caches it per process
