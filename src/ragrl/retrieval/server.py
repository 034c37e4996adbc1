"""A Search-R1-compatible retrieval server: `POST /retrieve`, `GET /health`.

Wire format, matched to Search-R1's `search_r1/search/retrieval_server.py` (its FastAPI
`QueryRequest` and `retrieve_endpoint`):

    request   {"queries": ["q1", ...], "topk": 3, "return_scores": true}
              topk missing or null -> the server's default; return_scores defaults to false.
    response  {"result": [[{"document": {"id": "p1", "contents": "\\"Title\\"\\ntext"},
                            "score": 12.3}, ...], ...]}          # return_scores true
              {"result": [[{"id": "p1", "contents": "..."}, ...], ...]}  # return_scores false

The document dict is a wiki-18 corpus row as Search-R1's dense retriever returns it (`id`,
`contents` = quoted title, newline, text). Like Search-R1 there is no single `"query"` field.
Where Search-R1 is lax this server is strict, because silent fallbacks hide client bugs:
`topk: 0` is an error (Search-R1 falls back to the default), unknown fields are errors (a
typo such as `top_k` would otherwise silently get the default), and empty queries are errors.

Every client mistake is a 4xx with `{"error": "..."}` naming it, decided before any search:
413 body too large (Content-Length checked, and the streamed body is counted too, so a lying
or missing Content-Length cannot push more than `max_body_bytes` + 1 bytes in), 400 body not
UTF-8 / not JSON, 422 a field is wrong or over a limit, 401 missing or wrong bearer token.
"""
from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import math
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from ragrl.errors import ConfigError, RagrlError
from ragrl.retrieval.base import Hit, Retriever
from ragrl.retrieval.batcher import MicroBatcher
from ragrl.retrieval.index import load_index
from ragrl.retrieval.settings import ServerSettings

log = logging.getLogger(__name__)

REQUEST_FIELDS = ("queries", "topk", "return_scores")


class ClientError(Exception):
    """A request problem the client must fix; becomes a 4xx `{"error": message}`."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


def _error(status: int, message: str, headers: dict | None = None) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers)


# ---- the guard: auth and body size before any routing or parsing ----------------------


class RequestGuard:
    """Pure ASGI middleware: checks the bearer token and reads the body under a byte cap.

    The whole body (at most max_body_bytes) is read here, then replayed to the app, so no
    handler can ever see, or wait for, more than the cap. Logs one debug line per request.
    """

    def __init__(self, app, settings: ServerSettings, protected: tuple[str, ...] = ("/retrieve",),
                 retrieve: Callable | None = None):
        self.app = app
        self.settings = settings
        self.protected = protected
        self.retrieve = retrieve  # POST /retrieve fast path: async (body) -> (status, json bytes)
        self._expected = f"Bearer {settings.token}".encode() if settings.token else None

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        t0 = time.perf_counter()
        status = {"code": 0}

        async def send_logged(message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            response = self._check_auth(scope)
            if response is None:
                body, response = await self._read_body(scope, receive)
            if response is not None:
                await response(scope, receive, send_logged)
            elif self.retrieve is not None and scope["path"] == "/retrieve" and scope["method"] == "POST":
                # The hot path skips FastAPI's routing, dependency solving and exception
                # middlewares: they cost about as much CPU per request as a BM25 search.
                await self._send_json(send_logged, *await self._answer(body))
            else:
                await self.app(scope, _replay(body, receive), send_logged)
        finally:
            if log.isEnabledFor(logging.DEBUG):
                ms = (time.perf_counter() - t0) * 1000
                log.debug("%s %s -> %s in %.1f ms", scope["method"], scope["path"], status["code"], ms)

    async def _answer(self, body: bytes) -> tuple[int, bytes]:
        try:
            return await self.retrieve(body)
        except Exception as e:  # noqa: BLE001 - an index failure: log it, answer 500, keep serving
            log.exception("internal error on /retrieve")
            return 500, _json_bytes({"error": f"internal server error: {type(e).__name__}"})

    @staticmethod
    async def _send_json(send, status: int, payload: bytes) -> None:
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": payload})

    def _check_auth(self, scope) -> Response | None:
        if self._expected is None or scope["path"] not in self.protected:
            return None
        given = dict(scope["headers"]).get(b"authorization", b"")
        # compare_digest takes time independent of where the strings differ.
        if hmac.compare_digest(given, self._expected):
            return None
        what = "missing bearer token" if not given else "wrong bearer token"
        return _error(401, f"unauthorized: {what}", {"WWW-Authenticate": "Bearer"})

    async def _read_body(self, scope, receive) -> tuple[bytes, Response | None]:
        cap = self.settings.max_body_bytes
        # "Connection: close" makes uvicorn drop the connection after the refusal instead of
        # reading (and discarding) the rest of an oversized body to keep the connection alive.
        close = {"Connection": "close"}
        too_large = _error(413, f"request body larger than max_body_bytes={cap}", close)
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None:
            if not declared.isdigit():
                return b"", _error(400, "invalid Content-Length header", close)
            if int(declared) > cap:
                return b"", too_large
        chunks, size = [], 0
        try:
            async with asyncio.timeout(self.settings.body_timeout_s):
                while True:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        return b"", _error(400, "client disconnected before sending the body", close)
                    chunk = message.get("body", b"")
                    size += len(chunk)
                    if size > cap:  # stop reading at the first byte over the cap
                        return b"", too_large
                    chunks.append(chunk)
                    if not message.get("more_body", False):
                        return b"".join(chunks), None
        except TimeoutError:
            return b"", _error(408, f"request body not received within {self.settings.body_timeout_s}s", close)


def _replay(body: bytes, receive):
    """An ASGI `receive` that yields the already-read body once, then the real connection's
    messages (so a handler watching for http.disconnect still sees it)."""
    sent = False

    async def replayed():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed


# ---- request parsing: every check names the field and the limit ------------------------


@dataclass
class RetrieveRequest:
    queries: list[str]
    topk: int
    return_scores: bool


def parse_retrieve_request(body: bytes, s: ServerSettings) -> RetrieveRequest:
    """Decode and validate a /retrieve body or raise ClientError (never anything else)."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ClientError(400, f"request body is not valid UTF-8 (byte {e.start})") from None
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as e:  # JSONDecodeError, huge ints, deep nesting
        raise ClientError(400, f"request body is not valid JSON: {str(e)[:200]}") from None
    if not isinstance(data, dict):
        raise ClientError(422, f"request body must be a JSON object, got {_json_type(data)}")
    unknown = sorted(set(data) - set(REQUEST_FIELDS))
    if unknown:
        raise ClientError(422, f"unknown field(s) {unknown}; expected {list(REQUEST_FIELDS)}")

    if "queries" not in data:
        raise ClientError(422, "missing field 'queries' (a list of strings)")
    queries = data["queries"]
    if not isinstance(queries, list):
        raise ClientError(422, f"'queries' must be a list of strings, got {_json_type(queries)}")
    if len(queries) > s.max_queries_per_request:
        raise ClientError(
            422, f"too many queries: {len(queries)} > max_queries_per_request={s.max_queries_per_request}"
        )
    for i, q in enumerate(queries):
        if not isinstance(q, str):
            raise ClientError(422, f"queries[{i}] must be a string, got {_json_type(q)}")
        if not q.strip():
            raise ClientError(422, f"queries[{i}] is empty or whitespace")
        if len(q) > s.max_query_chars:
            raise ClientError(422, f"queries[{i}] is too long: {len(q)} > max_query_chars={s.max_query_chars}")
        try:
            q.encode("utf-8")
        except UnicodeEncodeError:  # JSON "\ud800" escapes decode to lone surrogates
            raise ClientError(422, f"queries[{i}] contains an unpaired surrogate escape") from None

    topk = data.get("topk")
    if topk is None:
        topk = s.default_topk
    elif isinstance(topk, bool) or not isinstance(topk, int):  # bool is an int in Python
        raise ClientError(422, f"'topk' must be a positive integer, got {_json_type(topk)}")
    elif topk < 1:
        raise ClientError(422, f"'topk' must be a positive integer, got {topk}")
    elif topk > s.max_topk:
        raise ClientError(422, f"'topk' too large: {topk} > max_topk={s.max_topk}")

    return_scores = data.get("return_scores", False)
    if not isinstance(return_scores, bool):
        raise ClientError(422, f"'return_scores' must be true or false, got {_json_type(return_scores)}")
    return RetrieveRequest(queries=queries, topk=topk, return_scores=return_scores)


def _json_type(value) -> str:
    names = {dict: "object", list: "array", str: "string", bool: "boolean", int: "integer", float: "number"}
    return "null" if value is None else names.get(type(value), type(value).__name__)


def format_results(hits: list[list[Hit]], return_scores: bool) -> dict:
    """Search-R1's response body for per-query hit lists."""
    def doc(h: Hit) -> dict:
        return {"id": h.id, "contents": h.contents}

    if return_scores:
        return {"result": [[{"document": doc(h), "score": _finite(h.score)} for h in row] for row in hits]}
    return {"result": [[doc(h) for h in row] for row in hits]}


def _json_bytes(obj) -> bytes:
    return json.dumps(obj, ensure_ascii=False).encode("utf-8")


def _finite(x: float) -> float | None:
    x = float(x)
    return x if math.isfinite(x) else None  # JSON has no NaN/inf


# ---- the app ---------------------------------------------------------------------------


def create_app(retriever: Retriever, settings: ServerSettings | None = None) -> FastAPI:
    """A FastAPI app serving `retriever` through a MicroBatcher (closed on app shutdown)."""
    s = settings or ServerSettings()
    batcher = MicroBatcher(retriever, max_batch=s.max_batch, max_wait_ms=s.max_wait_ms)
    manifest = getattr(retriever, "manifest", None) or {}
    try:
        size = len(retriever)  # type: ignore[arg-type]
    except TypeError:
        size = None
    health = {
        "status": "ok",
        # kind, corpus hash, parameters and encoder say which index this is: a client of several
        # replicas checks that they agree (retrieval/client.py).
        "index": {"kind": manifest.get("kind"), "name": manifest.get("name") or _index_name(retriever),
                  "corpus_sha256": manifest.get("corpus_sha256"), "params": manifest.get("params"),
                  "encoder": manifest.get("encoder")},
        "size": size,
        "limits": {
            "max_queries_per_request": s.max_queries_per_request,
            "max_topk": s.max_topk,
            "max_query_chars": s.max_query_chars,
            "max_body_bytes": s.max_body_bytes,
            "default_topk": s.default_topk,
        },
    }

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        batcher.close()  # server shutdown: let the worker finish and exit

    async def answer_retrieve(body: bytes) -> tuple[int, bytes]:
        """(status, JSON bytes) for a /retrieve body: 4xx for client errors, else the hits."""
        try:
            req = parse_retrieve_request(body, s)
        except ClientError as e:
            return e.status, _json_bytes({"error": e.message})
        hits = await batcher.search(req.queries, req.topk)
        return 200, _json_bytes(format_results(hits, req.return_scores))

    app = FastAPI(title="ragrl retrieval", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)
    app.state.batcher = batcher
    app.state.settings = s
    app.add_middleware(RequestGuard, settings=s, retrieve=answer_retrieve)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return _error(exc.status_code, str(exc.detail))  # 404/405 in the same {"error"} shape

    @app.exception_handler(Exception)
    async def server_error(request: Request, exc: Exception) -> JSONResponse:
        log.exception("internal error on %s", request.url.path)
        return _error(500, f"internal server error: {type(exc).__name__}")

    @app.get("/health")
    async def get_health() -> dict:
        # searches < queries means concurrent requests were merged by the micro-batcher.
        return {**health, "stats": {"searches": batcher.calls, "queries": batcher.queries}}

    @app.post("/retrieve")
    async def retrieve(request: Request) -> Response:
        # RequestGuard answers POST /retrieve itself (fast path); this route declares the
        # endpoint (GET /retrieve -> 405) and serves it if the app is run without the guard.
        status, payload = await answer_retrieve(await request.body())
        return Response(payload, status_code=status, media_type="application/json")

    return app


def _index_name(retriever) -> str | None:
    path = getattr(retriever, "path", None) or getattr(getattr(retriever, "index", None), "path", None)
    return Path(path).name if path else None


def uvicorn_config(app, host: str, port: int, **overrides):
    """uvicorn settings for this server: one worker, bounded concurrency, short keep-alive."""
    import uvicorn  # late: the web stack loads only when a server starts

    options = dict(
        host=host,
        port=port,
        workers=1,  # the index lives in this process; the batcher is what gives parallel speed
        limit_concurrency=1024,  # beyond this many open connections/tasks, answer 503
        timeout_keep_alive=5,
        backlog=2048,
        access_log=False,  # RequestGuard logs one line per request at debug level
        log_level="warning",
        log_config=None,  # keep the host program's logging setup (uvicorn's would replace it)
        timeout_graceful_shutdown=5,
        h11_max_incomplete_event_size=64 * 1024,  # cap on header bytes
    )
    options.update(overrides)
    return uvicorn.Config(app, **options)


def serve(
    index_dir: str | Path,
    host: str = "127.0.0.1",
    port: int = 8000,
    on_ready: Callable[[str], None] | None = None,
    **settings,
) -> None:
    """Load the index in `index_dir` and serve it until interrupted.

    `settings` are ServerSettings fields; `on_ready(url)` is called once the socket listens
    (port=0 picks a free port, and the url then holds the real one).
    """
    import uvicorn  # late: the web stack loads only when a server starts

    try:
        server_settings = ServerSettings(**settings)
    except TypeError as e:  # an unknown keyword
        raise ConfigError(f"bad server setting: {e}") from None
    app = create_app(load_index(index_dir), server_settings)
    sock = bind_socket(host, port)  # bound here so "port in use" is one clear error
    config = uvicorn_config(app, host, port)
    server = uvicorn.Server(config)

    async def main() -> None:
        task = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started and not task.done():
            await asyncio.sleep(0.05)
        if server.started and on_ready is not None:
            on_ready(f"http://{host}:{sock.getsockname()[1]}")
        await task

    # The loop uvicorn would choose itself (uvloop when installed).
    with asyncio.Runner(loop_factory=config.get_loop_factory()) as runner:
        runner.run(main())


def bind_socket(host: str, port: int):
    """A bound TCP socket on host:port (uvicorn listens on it), or a RagrlError saying why not."""

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto=IPPROTO_TCP matters: asyncio only sets TCP_NODELAY on sockets that say they are TCP,
    # and without it Nagle + delayed ACKs add ~40 ms to every small request/response.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise RagrlError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    return sock


class ServerThread:
    """Run an app under uvicorn in a background thread (tests, notebooks, benchmarks).

        with ServerThread(create_app(index)) as url:
            RetrievalClient(url).search(["q"], 3)
    """

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0, **uvicorn_overrides):
        import uvicorn  # late: the web stack loads only when a server starts

        self.sock = bind_socket(host, port)
        self.url = f"http://{host}:{self.sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn_config(app, host, port, **uvicorn_overrides))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]},
                                       name="ragrl-server", daemon=True)

    def start(self, timeout: float = 30.0) -> str:
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("retrieval server did not start")
            time.sleep(0.01)
        return self.url

    def stop(self, timeout: float = 10.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout)
        self.sock.close()

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
