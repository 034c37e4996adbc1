"""HTTP client for a Search-R1-compatible retrieval server (`ragrl serve` or Search-R1's own).

`RetrievalClient` implements `Retriever`, so a rollout can search a remote index exactly as it
searches a local one: the same query rules (see inprocess.search_in_chunks), chunked to the
server's max_queries_per_request, and failing fast on 4xx (but 429) with the server's own message.

A server that goes away (connection errors, timeouts, 5xx, 429) is waited for: retries with
full-jitter exponential backoff (`backoff_delays`) for up to `max_wait_s` (default 120 s) since
the first failed attempt, so a restarting `ragrl serve` does not end a training run. Waiting logs
a WARNING (URL and reason) and then an INFO line about every 10 s on the "ragrl.retrieval" logger;
a server still away after that raises `RetrievalUnavailable`.

Replicas: `url` may name several servers of the same index ("http://a:8000,http://b:8000", or a
list). Calls go to them in turn; a replica that fails is skipped for `replica_rest_s` (each call
still tries it last), and the call moves on to the next at once, so one replica going away costs
no wait while another answers. Only when every replica has failed does the call wait, by the rules
above, until one answers. The replicas that answer at first contact must serve the same index
(their /health manifests agree), or the client refuses them by name.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import random
import threading
import time
from collections.abc import Iterator

import httpx

from ragrl.errors import RagrlError
from ragrl.retrieval.base import Hit
from ragrl.retrieval.inprocess import as_query_list, check_k, prepare_query, search_in_chunks
from ragrl.retrieval.settings import ServerSettings

RETRYABLE_4XX = (429,)  # "slow down" is worth retrying; every other 4xx is the caller's bug

log = logging.getLogger("ragrl.retrieval")


class RetrievalHTTPError(RagrlError):
    """The server refused a request (status 4xx) or could not be reached/answer (after waiting)."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


class RetrievalUnavailable(RetrievalHTTPError):
    """The server did not answer (connection errors, timeouts, 5xx, 429) for `waited_s` seconds.

    The trainer catches it by name to checkpoint and exit with a retryable status; `status` is None.
    """

    def __init__(self, url: str, waited_s: float, last_error: str, attempts: int):
        shown = f"{waited_s:.0f}" if waited_s >= 10 else f"{waited_s:.1f}"
        super().__init__(f"retrieval server {url} did not answer for {shown} s "
                         f"({attempts} attempt{'s' * (attempts != 1)}, last error: {last_error})")
        self.url, self.waited_s, self.last_error, self.attempts = url, waited_s, last_error, attempts


def backoff_delays(backoff: float, max_backoff: float, rng: random.Random) -> Iterator[float]:
    """Endless full-jitter exponential backoff: delay n (from 0) is uniform in [0, cap_n], where
    cap_n = min(max_backoff, backoff * 2**n). Full jitter spreads the retries of many rollouts
    so a restarted server is not hit by all of them at the same instant.

    >>> import itertools
    >>> delays = list(itertools.islice(backoff_delays(0.5, 3.0, random.Random(0)), 6))
    >>> caps = [0.5, 1.0, 2.0, 3.0, 3.0, 3.0]
    >>> all(0.0 <= d <= cap for d, cap in zip(delays, caps))
    True
    >>> delays == list(itertools.islice(backoff_delays(0.5, 3.0, random.Random(0)), 6))  # seeded
    True
    """
    cap = min(backoff, max_backoff)
    while True:
        yield rng.uniform(0.0, cap)
        cap = min(cap * 2, max_backoff)  # capped before it grows: no float overflow however long


def split_contents(contents: str) -> tuple[str, str]:
    """Search-R1 `contents` ('"Title"\\ntext') -> (title, text); undoes Hit.contents exactly."""
    title, _, text = contents.partition("\n")
    if len(title) >= 2 and title[0] == '"' and title[-1] == '"':
        title = title[1:-1]
    return title, text


def parse_hits(payload, n_queries: int) -> list[list[Hit]]:
    """Turn a /retrieve response body (with or without scores) into hit lists."""
    rows = payload.get("result") if isinstance(payload, dict) else None
    if not isinstance(rows, list) or len(rows) != n_queries:
        raise RagrlError(f"malformed retrieval response: expected 'result' with {n_queries} lists")
    try:
        return [[_parse_item(item) for item in row] for row in rows]
    except (KeyError, TypeError, AttributeError, ValueError) as e:
        raise RagrlError(f"malformed retrieval response item: {type(e).__name__}: {e}") from None


def _parse_item(item: dict) -> Hit:
    doc, score = (item["document"], item.get("score")) if "document" in item else (item, None)
    if "title" in doc and "text" in doc:  # Search-R1's BM25 server returns these too
        title, text = str(doc["title"]), str(doc["text"])
    else:
        title, text = split_contents(str(doc["contents"]))
    score = float("nan") if score is None else float(score)
    return Hit(id=str(doc.get("id", "")), title=title, text=text, score=score)


def _error_message(response: httpx.Response) -> str:
    try:
        return str(response.json()["error"])
    except Exception:  # noqa: BLE001 - not our server's error shape: show the start of the body
        return response.text[:200] or response.reason_phrase


class _Base:
    """Settings, limits and response handling shared by the sync and async clients."""

    # While calls wait, at most one INFO line per this many seconds (per client, not per call:
    # dozens of concurrent rollouts waiting on one server should not flood the log).
    notice_every_s = 10.0

    # A replica that failed is tried last for this long, then takes its turn again.
    replica_rest_s = 5.0

    def __init__(self, url: str | list[str], *, topk_default: int = 3, timeout: float = 10.0,
                 max_wait_s: float = 120.0, backoff: float = 0.2, max_backoff: float = 5.0, seed: int | None = None,
                 token: str | None = None,
                 max_queries_per_request: int | None = None, max_query_chars: int | None = None):
        urls = [u.strip().rstrip("/") for u in (url.split(",") if isinstance(url, str) else url)]
        for u in urls:
            if not u.startswith(("http://", "https://")):
                raise RagrlError(f"retrieval server URL must start with http:// or https://, got {u!r}")
        if len(set(urls)) != len(urls):
            raise RagrlError(f"retrieval server URLs name one server twice: {url!r}")
        if max_wait_s < 0 or backoff < 0 or max_backoff < 0:
            raise RagrlError(f"max_wait_s, backoff and max_backoff must be >= 0, got "
                             f"{max_wait_s}, {backoff}, {max_backoff}")
        self.urls = urls
        self.url = ",".join(self.urls)   # what messages name: every replica
        self._turn = itertools.count()
        self._failed_at: dict[str, float] = {}   # replica -> when it last failed
        self.topk_default = topk_default
        self.timeout = timeout
        self.max_wait_s = float(max_wait_s)
        self.backoff, self.max_backoff = float(backoff), float(max_backoff)
        self.rng = random.Random(seed)  # the client's own: jitter is reproducible in tests
        # Outage bookkeeping shared by concurrent calls; only decides which log lines appear.
        self._notice_lock = threading.Lock()
        self._outage_since: float | None = None
        self._next_notice = 0.0
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._limits = {"max_queries_per_request": max_queries_per_request, "max_query_chars": max_query_chars}
        self.manifest: dict = {}

    def _order(self) -> list[str]:
        """This attempt's replicas, in turn from the next one; those resting after a failure last."""
        start = next(self._turn) % len(self.urls)
        ring = self.urls[start:] + self.urls[:start]
        now = time.monotonic()
        return sorted(ring, key=lambda u: now - self._failed_at.get(u, -1e18) < self.replica_rest_s)

    def _replica_failed(self, url: str, reason: str) -> None:
        if len(self.urls) > 1 and url not in self._failed_at:
            log.warning("retrieval replica %s is not answering (%s); the other %d take its requests",
                        url, reason, len(self.urls) - 1)
        self._failed_at[url] = time.monotonic()

    def _replica_answered(self, url: str) -> None:
        if self._failed_at.pop(url, None) is not None and len(self.urls) > 1:
            log.info("retrieval replica %s answers again", url)

    # What identifies an index in /health (the folder's name may differ between replicas' copies).
    IDENTITY = ("kind", "corpus_sha256", "params", "encoder")

    def _check_replicas(self, answers: dict[str, dict | None]) -> dict | None:
        """The /health of the replicas that answered at first contact (None: none did, or there is
        one replica): one index, or refused."""
        indexes = {u: {**{k: (h.get("index") or {}).get(k) for k in self.IDENTITY}, "size": h.get("size")}
                   for u, h in answers.items() if h is not None}
        first = next(iter(indexes), None)
        for u, index in indexes.items():
            if index != indexes[first]:
                differ = sorted(k for k in set(index) | set(indexes[first]) if index.get(k) != indexes[first].get(k))
                raise RagrlError(f"retrieval replicas {first} and {u} serve different indexes (their /health "
                                 f"manifests differ in {', '.join(differ)}); name replicas of one index only")
        return answers[first] if first else None

    def _outcome(self, response: httpx.Response | None, error: Exception | None):
        """(payload, None) on success; (None, reason) to retry; raises on a non-retryable 4xx."""
        if error is not None:
            return None, f"{type(error).__name__}: {error}"
        status = response.status_code
        if status < 400:
            try:
                return response.json(), None
            except ValueError:
                raise RetrievalHTTPError(f"{response.url}: response is not JSON", status) from None
        message = _error_message(response)
        if status < 500 and status not in RETRYABLE_4XX:
            raise RetrievalHTTPError(f"retrieval server refused the request (HTTP {status}): {message}", status)
        return None, f"HTTP {status}: {message}"

    def _waiting(self, waited: float, delay: float, reason: str) -> None:
        """Log the wait ahead: a WARNING when an outage starts, then INFO every notice_every_s."""
        now = time.monotonic()
        with self._notice_lock:
            starts = self._outage_since is None
            if starts:
                self._outage_since = now - waited
            notice = starts or now >= self._next_notice
            if notice:
                self._next_notice = now + self.notice_every_s
        if starts:
            log.warning("retrieval server %s is not answering (%s); retrying for up to %.0f s",
                        self.url, reason, self.max_wait_s)
        elif notice:
            log.info("still waiting for retrieval server %s: %.0f s of %.0f s, next try in %.1f s (%s)",
                     self.url, waited, self.max_wait_s, delay, reason)

    def _answered(self) -> None:
        if self._outage_since is None:  # the common case: no lock, no log
            return
        with self._notice_lock:
            since, self._outage_since = self._outage_since, None
        if since is not None:
            log.info("retrieval server %s answers again after %.1f s", self.url, time.monotonic() - since)

    def _unavailable(self, waited: float, reason: str, attempts: int) -> RetrievalUnavailable:
        with self._notice_lock:  # a later failure is a new outage and warns again
            self._outage_since = None
        return RetrievalUnavailable(self.url, waited, reason, attempts)

    def _learn_limits(self, health: dict | None) -> None:
        server = (health or {}).get("limits", {})
        defaults = ServerSettings()
        for key in self._limits:
            if self._limits[key] is None:
                self._limits[key] = int(server.get(key, getattr(defaults, key)))
        if health:
            self.manifest = health.get("index") or {}

    def _body(self, queries: list[str], k: int) -> dict:
        return {"queries": queries, "topk": k, "return_scores": True}


class _Patience:
    """One call's retry budget: its clock starts at its first attempt, so a call that keeps
    failing gives up once waiting more would pass max_wait_s (the last wait is cut to fit)."""

    def __init__(self, client: _Base):
        self.client = client
        self.start = time.monotonic()
        self.delays = backoff_delays(client.backoff, client.max_backoff, client.rng)
        self.attempts = 0

    def next_delay(self, reason: str) -> float:
        """Seconds to sleep before the next attempt; raises RetrievalUnavailable when time is up."""
        self.attempts += 1
        waited = time.monotonic() - self.start
        left = self.client.max_wait_s - waited
        if left <= 0:
            raise self.client._unavailable(waited, reason, self.attempts)
        delay = min(next(self.delays), left)
        self.client._waiting(waited, delay, reason)
        return delay


class RetrievalClient(_Base):
    """Blocking client; `search(queries, k)` -> `list[list[Hit]]`. Use as a context manager."""

    def __init__(self, url: str, **options):
        super().__init__(url, **options)
        self._http = httpx.Client(timeout=self.timeout, headers=self.headers)

    def _attempt(self, url: str, method: str, path: str, body: dict | None):
        try:
            response, error = self._http.request(method, url + path, json=body), None
        except httpx.TransportError as e:  # refused, reset, timed out, protocol error
            response, error = None, e
        return self._outcome(response, error)

    def _call(self, method: str, path: str, body: dict | None = None):
        patience = _Patience(self)
        while True:
            for url in self._order():   # one replica failing moves the call on at once
                payload, reason = self._attempt(url, method, path, body)
                if reason is None:
                    self._replica_answered(url)
                    self._answered()
                    return payload
                self._replica_failed(url, reason)
            time.sleep(patience.next_delay(reason))

    def _probe(self, url: str) -> dict | None:
        """One GET /health of one replica: its body, or None (away, or a server without /health)."""
        try:
            payload, reason = self._attempt(url, "GET", "/health", None)
        except RetrievalHTTPError:
            return None
        return payload if reason is None else None

    def health(self) -> dict:
        return self._call("GET", "/health")

    def _ensure_limits(self) -> None:
        if None in self._limits.values():
            # Several replicas: one try each, and those that answer must agree.
            health = self._check_replicas({u: self._probe(u) for u in self.urls if len(self.urls) > 1})
            if health is None:
                try:
                    health = self.health()
                except RetrievalHTTPError as e:
                    if e.status is None:
                        raise  # unreachable: no point searching either
                    health = None  # e.g. Search-R1's own server has no /health: use our defaults
            self._learn_limits(health)

    def search(self, queries: list[str], k: int | None = None) -> list[list[Hit]]:
        k = check_k(self.topk_default if k is None else k, 10**9)  # the server enforces max_topk
        self._ensure_limits()
        lim = self._limits

        def post(chunk: list[str], k: int) -> list[list[Hit]]:
            return parse_hits(self._call("POST", "/retrieve", self._body(chunk, k)), len(chunk))

        return search_in_chunks(post, queries, k, lim["max_query_chars"], lim["max_queries_per_request"])

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "RetrievalClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class AsyncRetrievalClient(_Base):
    """The same client for asyncio code: `await client.search(queries, k)`."""

    def __init__(self, url: str, **options):
        super().__init__(url, **options)
        self._http = httpx.AsyncClient(timeout=self.timeout, headers=self.headers)

    async def _attempt(self, url: str, method: str, path: str, body: dict | None):
        try:
            response, error = await self._http.request(method, url + path, json=body), None
        except httpx.TransportError as e:
            response, error = None, e
        return self._outcome(response, error)

    async def _call(self, method: str, path: str, body: dict | None = None):
        patience = _Patience(self)
        while True:
            for url in self._order():
                payload, reason = await self._attempt(url, method, path, body)
                if reason is None:
                    self._replica_answered(url)
                    self._answered()
                    return payload
                self._replica_failed(url, reason)
            await asyncio.sleep(patience.next_delay(reason))

    async def _probe(self, url: str) -> dict | None:
        try:
            payload, reason = await self._attempt(url, "GET", "/health", None)
        except RetrievalHTTPError:
            return None
        return payload if reason is None else None

    async def health(self) -> dict:
        return await self._call("GET", "/health")

    async def search(self, queries: list[str], k: int | None = None) -> list[list[Hit]]:
        k = check_k(self.topk_default if k is None else k, 10**9)
        if None in self._limits.values():
            health = self._check_replicas({u: await self._probe(u) for u in self.urls if len(self.urls) > 1})
            if health is None:
                try:
                    health = await self.health()
                except RetrievalHTTPError as e:
                    if e.status is None:
                        raise
                    health = None
            self._learn_limits(health)
        lim = self._limits
        # The same rules as search_in_chunks, written out because the calls are awaited.
        prepared = [prepare_query(q, lim["max_query_chars"]) for q in as_query_list(queries)]
        rows = [i for i, q in enumerate(prepared) if q is not None]
        results: list[list[Hit]] = [[] for _ in prepared]
        for start in range(0, len(rows), lim["max_queries_per_request"]):
            chunk_rows = rows[start : start + lim["max_queries_per_request"]]
            chunk = [prepared[i] for i in chunk_rows]
            hits = parse_hits(await self._call("POST", "/retrieve", self._body(chunk, k)), len(chunk))
            for i, h in zip(chunk_rows, hits):
                results[i] = h
        return results

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> "AsyncRetrievalClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()

