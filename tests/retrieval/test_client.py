"""RetrievalClient / InProcessRetriever / make_retriever against a real server and BM25 index."""
import asyncio
import socket
import time

import pytest

from ragrl.errors import RagrlError
from ragrl.retrieval.base import Hit, Retriever
from ragrl.retrieval.client import AsyncRetrievalClient, RetrievalClient, RetrievalHTTPError, split_contents
from ragrl.retrieval.inprocess import InProcessRetriever
from ragrl.retrieval.resolve import make_retriever
from ragrl.retrieval.server import ServerSettings, ServerThread, create_app
from tests.retrieval.serving import Counting, Flaky, demo_questions

# Small limits so that chunking and truncation happen with a handful of queries.
SMALL = dict(max_queries_per_request=4, max_query_chars=300, max_topk=10)


@pytest.fixture(scope="module")
def index(demo_bm25_index):
    return demo_bm25_index


@pytest.fixture(scope="module")
def counting(index):
    return Counting(index)


@pytest.fixture(scope="module")
def url(counting):
    with ServerThread(create_app(counting, ServerSettings(**SMALL))) as url:
        yield url


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_split_contents_undoes_hit_contents():
    for title, text in [("Paris", "Capital.\nSecond line"), ('"Heroes" (song)', "Bowie"), ("", "no title")]:
        hit = Hit(id="x", title=title, text=text, score=1.0)
        assert split_contents(hit.contents) == (title, text)


def test_client_hits_equal_index_hits(url, index):
    queries = demo_questions(3)
    with RetrievalClient(url) as client:
        assert isinstance(client, Retriever)
        assert client.search(queries, 5) == index.search(queries, 5)  # ids, titles, texts, scores
        assert client.search(queries[:1]) == index.search(queries[:1], 3)  # topk_default
        assert client.health()["size"] == len(index)


def test_client_chunks_truncates_and_skips_blank_queries_like_in_process(url, index, counting):
    long_query = "who wrote the play hamlet " * 20  # 520 chars, server max is 300
    queries = demo_questions(9) + ["", "   ", long_query]
    before = len(counting.batches)
    with RetrievalClient(url) as client:
        remote = client.search(queries, 3)
    # 10 non-blank queries in chunks of max_queries_per_request=4: requests of 4, 4, 2.
    assert sorted(counting.batches[before:], reverse=True) == [4, 4, 2]
    assert remote[9] == [] and remote[10] == []
    assert remote[11] == index.search([long_query[:300]], 3)[0]
    local = InProcessRetriever(index, ServerSettings(**SMALL)).search(queries, 3)
    assert local == remote  # the same rollout behaviour in-process and over HTTP


def test_client_fails_fast_on_4xx_with_server_message(url):
    with RetrievalClient(url, backoff=5.0) as client:  # a retry would take >= 5 s
        t0 = time.monotonic()
        with pytest.raises(RetrievalHTTPError, match="max_topk=10") as err:
            client.search(["who wrote hamlet"], 11)
        assert err.value.status == 422 and time.monotonic() - t0 < 2.0
        with pytest.raises(RagrlError, match="positive integer"):
            client.search(["who wrote hamlet"], 0)  # refused locally, never sent


def test_client_token_errors_fail_fast(index):
    with ServerThread(create_app(index, ServerSettings(token="tok"))) as url:
        with RetrievalClient(url, token="tok") as good:
            assert good.search(["who wrote hamlet"], 2) == index.search(["who wrote hamlet"], 2)
        with RetrievalClient(url, token="bad", backoff=5.0) as bad:
            with pytest.raises(RetrievalHTTPError, match="wrong bearer token") as err:
                bad.search(["who wrote hamlet"], 2)
            assert err.value.status == 401


def test_client_retries_5xx_until_success(index):
    flaky = Flaky(index, failures=2)
    with ServerThread(create_app(flaky)) as url, RetrievalClient(url, retries=3, backoff=0.01) as client:
        assert client.search(["who wrote hamlet"], 3) == index.search(["who wrote hamlet"], 3)
        assert flaky.failures_left == 0 and flaky.batches == [1]  # 2 failed tries, then 1 real search


def test_client_gives_up_after_retries(index):
    flaky = Flaky(index, failures=10)
    with ServerThread(create_app(flaky)) as url, RetrievalClient(url, retries=2, backoff=0.01) as client:
        with pytest.raises(RetrievalHTTPError, match="failed after 3 attempts: HTTP 500"):
            client.search(["who wrote hamlet"], 3)
        assert flaky.failures_left == 7


def test_client_retries_connection_errors_then_raises():
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    with RetrievalClient(url, retries=2, backoff=0.05, timeout=1.0) as client:
        t0 = time.monotonic()
        with pytest.raises(RetrievalHTTPError, match="failed after 3 attempts: ConnectError"):
            client.search(["q"], 3)
        assert time.monotonic() - t0 >= 0.05 + 0.1  # backoff 0.05 then 0.1


def test_async_client_matches_index(url, index):
    queries = demo_questions(6) + [""]

    async def run():
        async with AsyncRetrievalClient(url) as client:
            return await asyncio.gather(client.search(queries, 2), client.search(queries[:1], 4))

    many, one = asyncio.run(run())
    assert many == index.search(queries[:6], 2) + [[]]
    assert one == index.search(queries[:1], 4)


def test_make_retriever(url, index):
    local = make_retriever(index.path)
    assert isinstance(local, InProcessRetriever) and local.search(["hamlet"], 2) == index.search(["hamlet"], 2)
    remote = make_retriever(url, retries=0)
    assert isinstance(remote, RetrievalClient) and remote.search(["hamlet"], 2) == index.search(["hamlet"], 2)
    remote.close()
    with pytest.raises(RagrlError, match="neither an http"):
        make_retriever("/no/such/index")
    with pytest.raises(RagrlError, match="unsupported retriever URL"):
        make_retriever("ftp://example.org/index")
    with pytest.raises(RagrlError, match="must be a string"):
        local.search(["ok", 3], 2)
    with pytest.raises(RagrlError, match="larger than max_topk"):
        local.search(["ok"], 101)
