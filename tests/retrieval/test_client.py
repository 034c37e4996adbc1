"""RetrievalClient / InProcessRetriever / make_retriever against a real server and BM25 index."""
import asyncio
import itertools
import logging
import random
import re
import socket
import subprocess
import sys
import threading
import time

import pytest

from ragrl.errors import RagrlError
from ragrl.retrieval.base import Hit, Retriever
from ragrl.retrieval.client import (AsyncRetrievalClient, RetrievalClient, RetrievalHTTPError,
                                    RetrievalUnavailable, backoff_delays, split_contents)
from ragrl.retrieval.inprocess import InProcessRetriever
from ragrl.retrieval.resolve import make_retriever, retriever_for
from ragrl.retrieval.server import ServerSettings, ServerThread, create_app
from ragrl.train.config import TrainConfig
from ragrl.train.setup import default_retriever
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


def serve_process(index_dir, port: int = 0) -> tuple[subprocess.Popen, str]:
    """A real `ragrl serve` process (not a thread), so a test can kill it like a crash would."""
    cmd = [sys.executable, "-m", "ragrl.cli.main", "serve", "--index", str(index_dir), "--port", str(port)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    while line := proc.stdout.readline():  # log lines may come before the ready line
        if "ready at " in line:
            return proc, line.split("ready at ")[1].split()[0]
        lines.append(line)
    proc.wait(10)
    raise RuntimeError(f"ragrl serve did not start: {''.join(lines)[-2000:]}")


def stop(proc: subprocess.Popen | None) -> None:
    if proc is not None and proc.poll() is None:
        proc.kill()
        proc.wait(10)


def client_log(caplog, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "ragrl.retrieval" and r.levelno == level]


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
        assert type(err.value) is RetrievalHTTPError  # a refusal, not "unavailable": nothing waited
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
    with ServerThread(create_app(flaky)) as url, RetrievalClient(url, max_wait_s=10, backoff=0.01) as client:
        assert client.search(["who wrote hamlet"], 3) == index.search(["who wrote hamlet"], 3)
        assert flaky.failures_left == 0 and flaky.batches == [1]  # 2 failed tries, then 1 real search


def test_client_gives_up_on_5xx_after_max_wait(index):
    flaky = Flaky(index, failures=10**6)  # the fault is injected: a server that answers 500 forever
    with ServerThread(create_app(flaky)) as url, \
            RetrievalClient(url, max_wait_s=0.5, backoff=0.01, max_backoff=0.05, seed=0) as client:
        t0 = time.monotonic()
        with pytest.raises(RetrievalUnavailable, match="did not answer for 0.5 s .*last error: HTTP 500"):
            client.search(["who wrote hamlet"], 3)
        assert 0.5 <= time.monotonic() - t0 < 3.5   # bounds loose enough for a machine under load
        assert 10**6 - flaky.failures_left >= 3  # it kept trying, not just waited


def backoff_delays_take(n: int, backoff: float, max_backoff: float, seed: int = 0) -> list[float]:
    return list(itertools.islice(backoff_delays(backoff, max_backoff, random.Random(seed)), n))


def test_backoff_delays_are_full_jitter_under_a_doubling_capped_bound():
    delays = backoff_delays_take(2000, 0.2, 5.0)
    caps = [min(5.0, 0.2 * 2 ** min(n, 10)) for n in range(len(delays))]  # 0.2, 0.4, ..., 3.2, then 5.0
    assert all(0.0 <= d <= cap for d, cap in zip(delays, caps))
    late = delays[10:]  # all capped at 5.0: uniform in [0, 5], so spread out, mean about 2.5
    assert min(late) < 0.5 and max(late) > 4.5 and 2.2 < sum(late) / len(late) < 2.8
    assert delays == backoff_delays_take(2000, 0.2, 5.0)  # a seeded rng replays the schedule
    assert delays != backoff_delays_take(2000, 0.2, 5.0, seed=1)
    assert backoff_delays_take(3, 0.0, 5.0) == [0.0, 0.0, 0.0]
    assert max(backoff_delays_take(50, 10.0, 1.0)) <= 1.0  # a first delay above the cap is capped


def test_client_waits_out_a_server_restart(index, caplog):
    downtime = 2.0
    query, launched, ready = ["who wrote hamlet"], [], []
    proc, url = serve_process(index.path)
    procs, port = [proc], int(url.rsplit(":", 1)[1])

    def restart():  # the same port, as a supervisor restarting `ragrl serve` would
        time.sleep(downtime)
        launched.append(time.monotonic())
        procs.append(serve_process(index.path, port)[0])
        ready.append(time.monotonic())   # serve_process saw it answer (the client may have, a moment before)

    try:
        with RetrievalClient(url, max_wait_s=20, backoff=0.05, max_backoff=0.25, seed=0) as client:
            assert client.search(query, 3) == index.search(query, 3)  # a pooled connection is now open
            stop(procs[0])
            down = time.monotonic()
            thread = threading.Thread(target=restart)
            thread.start()
            with caplog.at_level(logging.INFO, logger="ragrl.retrieval"):
                hits = client.search(query, 3)  # issued while nothing listens
            elapsed = time.monotonic() - down
            thread.join(30)
        assert hits == index.search(query, 3)
        assert elapsed >= launched[0] - down >= downtime  # it answered only once the new server was started
        assert elapsed < ready[0] - down + 4.0  # ... and soon after (max_backoff 0.25 s; loose for a loaded machine)
        [warning] = client_log(caplog, logging.WARNING)
        assert url in warning and "ConnectError" in warning
        assert any("answers again" in line for line in client_log(caplog, logging.INFO))
    finally:
        for proc in procs:
            stop(proc)


def test_client_raises_unavailable_when_the_server_stays_away(index, caplog):
    proc, url = serve_process(index.path)
    try:
        with RetrievalClient(url, max_wait_s=3, backoff=0.05, max_backoff=0.5, seed=0) as client:
            client.notice_every_s = 1.0  # the INFO cadence (10 s in real runs), shortened to be seen
            assert client.search(["hamlet"], 2) == index.search(["hamlet"], 2)
            stop(proc)
            t0 = time.monotonic()
            with caplog.at_level(logging.INFO, logger="ragrl.retrieval"), \
                    pytest.raises(RetrievalUnavailable) as err:
                client.search(["hamlet"], 2)
            elapsed = time.monotonic() - t0
    finally:
        stop(proc)
    assert 3.0 <= elapsed < 3.0 + 3.0
    e = err.value
    assert isinstance(e, RetrievalHTTPError) and e.status is None
    assert e.url == url and 3.0 <= e.waited_s <= elapsed
    assert re.match(rf"retrieval server {re.escape(url)} did not answer for 3\.\d s \(\d+ attempts, ", str(e))
    assert "last error: ConnectError" in str(e)
    [warning] = client_log(caplog, logging.WARNING)
    assert url in warning
    assert 1 <= len(client_log(caplog, logging.INFO)) <= 4  # about one per second of waiting, no flood


@pytest.mark.parametrize("asynchronous", [False, True])
def test_max_wait_zero_makes_one_attempt(index, asynchronous):
    flaky = Flaky(index, failures=10)  # injected 500s
    with ServerThread(create_app(flaky)) as url:
        if asynchronous:
            async def search():
                async with AsyncRetrievalClient(url, max_wait_s=0, backoff=5.0) as client:
                    return await client.search(["who wrote hamlet"], 3)
        t0 = time.monotonic()
        with pytest.raises(RetrievalUnavailable, match="1 attempt, last error: HTTP 500"):
            if asynchronous:
                asyncio.run(search())
            else:
                with RetrievalClient(url, max_wait_s=0, backoff=5.0) as client:
                    client.search(["who wrote hamlet"], 3)
        assert time.monotonic() - t0 < 4.0 and flaky.failures_left == 9


def test_async_client_waits_on_connection_errors_then_raises():
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there

    async def search():
        async with AsyncRetrievalClient(url, max_wait_s=0.5, backoff=0.05, timeout=1.0) as client:
            return await asyncio.gather(client.search(["q"], 3), client.search(["r"], 3),
                                        return_exceptions=True)

    t0 = time.monotonic()
    errors = asyncio.run(search())
    assert 0.5 <= time.monotonic() - t0 < 3.5
    for e in errors:
        assert isinstance(e, RetrievalUnavailable) and e.url == url and "ConnectError" in str(e)


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
    remote = make_retriever(url, max_wait_s=0)
    assert isinstance(remote, RetrievalClient) and remote.search(["hamlet"], 2) == index.search(["hamlet"], 2)
    remote.close()
    with ServerThread(create_app(Counting(index), ServerSettings(**SMALL))) as url2:
        replicas = retriever_for(f"{url}, {url2}/", None, wait_s=1)   # data.index naming replicas
        assert isinstance(replicas, RetrievalClient) and replicas.urls == [url, url2]
        assert replicas.search(["hamlet"], 2) == index.search(["hamlet"], 2)
        replicas.close()
    with pytest.raises(RagrlError, match="neither an http"):
        make_retriever("/no/such/index")
    with pytest.raises(RagrlError, match="unsupported retriever URL"):
        make_retriever("ftp://example.org/index")
    with pytest.raises(RagrlError, match="must be a string"):
        local.search(["ok", 3], 2)
    with pytest.raises(RagrlError, match="larger than max_topk"):
        local.search(["ok"], 101)


def test_retriever_for_and_the_trainer_pass_the_wait_to_a_server_only(url, index):
    remote = retriever_for(url, None, wait_s=7.5)
    assert isinstance(remote, RetrievalClient) and remote.max_wait_s == 7.5
    remote.close()
    default = retriever_for(url, None)
    assert default.max_wait_s == 120.0
    default.close()
    assert isinstance(retriever_for(str(index.path), None, wait_s=7.5), InProcessRetriever)  # never waits
    cfg = TrainConfig()
    cfg.data.index, cfg.guard.retrieval_wait_s = url, 42.0
    trainer = default_retriever(cfg)
    assert isinstance(trainer, RetrievalClient) and trainer.max_wait_s == 42.0
    trainer.close()


class OtherIndex(Counting):
    """The real index, announced in /health as another corpus's (a replica of the wrong index)."""

    def __init__(self, index):
        super().__init__(index)
        self.manifest = {**index.manifest, "corpus_sha256": "0" * 64}


def test_a_client_of_two_replicas_spreads_its_requests_over_both(index):
    a, b = Counting(index), Counting(index)
    with ServerThread(create_app(a)) as url_a, ServerThread(create_app(b)) as url_b:
        with RetrievalClient(f"{url_a},{url_b}") as client:
            queries = demo_questions(4)
            for _ in range(6):
                assert client.search(queries, 3) == index.search(queries, 3)
    assert len(a.batches) >= 2 and len(b.batches) >= 2   # in turn, not all on the first


@pytest.mark.parametrize("asynchronous", [False, True])
def test_a_client_of_two_replicas_goes_on_without_waiting_when_one_goes_away(index, caplog, asynchronous):
    queries, expected = demo_questions(3), index.search(demo_questions(3), 3)
    a, b = ServerThread(create_app(Counting(index))), ServerThread(create_app(Counting(index)))
    urls = [a.start(), b.start()]
    seen = {}

    def scenario(search):   # search(n) -> n results; the same steps for both clients
        assert search(2) == [expected] * 2
        a.stop()
        with caplog.at_level(logging.INFO, logger="ragrl.retrieval"):
            assert search(6) == [expected] * 6
        seen["warnings"] = client_log(caplog, logging.WARNING)
        b.stop()   # both gone: the usual wait, then the usual error naming both
        with pytest.raises(RetrievalUnavailable) as err:
            search(1)
        seen["error"] = err.value

    options = dict(max_wait_s=2, backoff=0.05, max_backoff=0.2, seed=0)
    try:
        if asynchronous:
            async def run():
                async with AsyncRetrievalClient(urls, **options) as client:
                    loop = asyncio.get_running_loop()

                    async def many(n):
                        return [await client.search(queries, 3) for _ in range(n)]
                    # The scenario's blocking steps run in a thread; its searches on this loop.
                    await asyncio.to_thread(scenario, lambda n: asyncio.run_coroutine_threadsafe(many(n), loop).result())
            asyncio.run(run())
        else:
            with RetrievalClient(urls, **options) as client:
                scenario(lambda n: [client.search(queries, 3) for _ in range(n)])
    finally:
        for server in (a, b):
            if server.thread.is_alive():
                server.stop()
    # No call waited: the one warning while a replica was down is the replica's, not an outage's.
    warnings = seen["warnings"]
    assert len(warnings) == 1 and urls[0] in warnings[0] and "the other 1 take its requests" in warnings[0]
    assert f"{urls[0]},{urls[1]}" in str(seen["error"]) and seen["error"].waited_s >= 2.0


def test_replicas_of_different_indexes_are_refused_by_name(index):
    with ServerThread(create_app(Counting(index))) as url_a, ServerThread(create_app(OtherIndex(index))) as url_b:
        with RetrievalClient([url_a, url_b]) as client, \
                pytest.raises(RagrlError, match=rf"replicas {re.escape(url_a)} and {re.escape(url_b)} serve "
                                                r"different indexes .* differ in corpus_sha256"):
            client.search(["hamlet"], 3)


def test_replica_lists_are_checked_before_any_request():
    with pytest.raises(RagrlError, match="must start with http"):
        RetrievalClient("http://127.0.0.1:1,ftp://x")
    with pytest.raises(RagrlError, match="name one server twice"):
        RetrievalClient("http://127.0.0.1:1,http://127.0.0.1:1/")
