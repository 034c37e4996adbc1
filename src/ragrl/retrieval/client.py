"""HTTP client for a Search-R1-compatible retrieval server (`ragrl serve` or Search-R1's own).

`RetrievalClient` implements `Retriever`, so a rollout can search a remote index exactly as it
searches a local one: the same query rules (see inprocess.search_in_chunks), chunked to the
server's max_queries_per_request, retried with exponential backoff on 5xx, 429 and
connection errors/timeouts, and failing fast on other 4xx with the server's own message.
"""
from __future__ import annotations

import asyncio
import time

import httpx

from ragrl.errors import RagrlError
from ragrl.retrieval.base import Hit
from ragrl.retrieval.inprocess import as_query_list, check_k, prepare_query, search_in_chunks
from ragrl.retrieval.settings import ServerSettings

RETRYABLE_4XX = (429,)  # "slow down" is worth retrying; every other 4xx is the caller's bug


class RetrievalHTTPError(RagrlError):
    """The server refused a request (status 4xx) or could not be reached/answer (after retries)."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


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

    def __init__(self, url: str, *, topk_default: int = 3, timeout: float = 10.0, retries: int = 3,
                 backoff: float = 0.2, token: str | None = None,
                 max_queries_per_request: int | None = None, max_query_chars: int | None = None):
        if not url.startswith(("http://", "https://")):
            raise RagrlError(f"retrieval server URL must start with http:// or https://, got {url!r}")
        self.url = url.rstrip("/")
        self.topk_default = topk_default
        self.timeout = timeout
        self.retries = max(0, int(retries))
        self.backoff = backoff
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._limits = {"max_queries_per_request": max_queries_per_request, "max_query_chars": max_query_chars}
        self.manifest: dict = {}

    def _outcome(self, response: httpx.Response | None, error: Exception | None):
        """(payload, None) on success; (None, reason) to retry; raises on a non-retryable 4xx."""
        if error is not None:
            return None, f"{type(error).__name__}: {error}"
        status = response.status_code
        if status < 400:
            try:
                return response.json(), None
            except ValueError:
                raise RetrievalHTTPError(f"{self.url}: response is not JSON", status) from None
        message = _error_message(response)
        if status < 500 and status not in RETRYABLE_4XX:
            raise RetrievalHTTPError(f"retrieval server refused the request (HTTP {status}): {message}", status)
        return None, f"HTTP {status}: {message}"

    def _give_up(self, reason: str) -> RetrievalHTTPError:
        return RetrievalHTTPError(f"retrieval server {self.url} failed after {self.retries + 1} attempts: {reason}")

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


class RetrievalClient(_Base):
    """Blocking client; `search(queries, k)` -> `list[list[Hit]]`. Use as a context manager."""

    def __init__(self, url: str, **options):
        super().__init__(url, **options)
        self._http = httpx.Client(timeout=self.timeout, headers=self.headers)

    def _call(self, method: str, path: str, body: dict | None = None):
        reason = ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.backoff * 2 ** (attempt - 1))
            try:
                response, error = self._http.request(method, self.url + path, json=body), None
            except httpx.TransportError as e:  # refused, reset, timed out, protocol error
                response, error = None, e
            payload, reason = self._outcome(response, error)
            if reason is None:
                return payload
        raise self._give_up(reason)

    def health(self) -> dict:
        return self._call("GET", "/health")

    def _ensure_limits(self) -> None:
        if None in self._limits.values():
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

    async def _call(self, method: str, path: str, body: dict | None = None):
        reason = ""
        for attempt in range(self.retries + 1):
            if attempt:
                await asyncio.sleep(self.backoff * 2 ** (attempt - 1))
            try:
                response, error = await self._http.request(method, self.url + path, json=body), None
            except httpx.TransportError as e:
                response, error = None, e
            payload, reason = self._outcome(response, error)
            if reason is None:
                return payload
        raise self._give_up(reason)

    async def health(self) -> dict:
        return await self._call("GET", "/health")

    async def search(self, queries: list[str], k: int | None = None) -> list[list[Hit]]:
        k = check_k(self.topk_default if k is None else k, 10**9)
        if None in self._limits.values():
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

