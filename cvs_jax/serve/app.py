"""The HTTP routes (FastAPI on Starlette): search, add, info, health, metrics, the page, thumbnails.

Every refusal is a 4xx JSON ``{"error": "..."}`` with one message, and anything unexpected a 500 with
one line (the traceback goes to the server's log, never to the client); the server keeps serving, and
the client's connection stays open (the 500 is answered by ``_Observe``, not re-raised into uvicorn).
Routes are module-level functions that find the server's state in ``request.app.state.ctx``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import io
import logging
import os
import time
from typing import Literal, overload

import numpy as np
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, Response
from PIL import Image
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import FormData, UploadFile
from starlette.exceptions import HTTPException

from cvs_jax.errors import IndexUnavailableError, NotWritableError, UserError, WorkdirBusyError
from cvs_jax.reports import search_page
from cvs_jax.retrieval import run_info
from cvs_jax.retrieval.run_reader import parse_int
from cvs_jax.rundir import paths
from cvs_jax.serve import guard, page, sessions
from cvs_jax.serve import uploads as uploads_lib
from cvs_jax.serve.metrics import Metrics
from cvs_jax.serve.state import Duplicate, Query, Served

log = logging.getLogger("cvs_jax.serve")


@dataclasses.dataclass(frozen=True)
class Limits:
    max_upload_bytes: int = 20 << 20  # one request's body
    max_images: int = 16  # images per request
    max_pixels: int = 40_000_000  # per image, checked from its header before decoding
    max_k: int = 100
    read_timeout_s: float = 30.0  # a request's body arrives within this, or the answer is 408


# uploads up to this size are decoded on the event loop (a small PNG decodes in 0.07 ms, less than a hop
# to the thread pool); bigger ones, whose decoding would stall other requests, in the thread pool
INLINE_DECODE_BYTES = 64 << 10


class _Refused(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def _error(status: int, message: str) -> JSONResponse:
    # a 401 says which scheme it wants (RFC 7235: a client may then retry with its token)
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return JSONResponse({"error": message}, status_code=status, headers=headers)


def _bool(value: str | None) -> bool:
    return value is not None and value.lower() in ("1", "true", "yes", "on")


@dataclasses.dataclass
class Ctx:
    """What every route reads: the served run, the limits, the token, the counters."""

    served: Served
    token: str | None
    limits: Limits
    metrics: Metrics
    allowed_hosts: tuple[str, ...] | None
    sessions: sessions.SessionJob


def _ctx(request: Request) -> Ctx:
    return request.app.state.ctx


class _Observe:
    """Counts every answer and its latency per route (``/metrics``), refuses a ``Host`` not allowed, and
    answers anything unexpected with one 500 line.  A plain ASGI middleware: Starlette's
    ``@app.middleware("http")`` wraps each request in extra tasks and streams, which cost a lone query
    about 0.3 ms here.  A 500 answered by Starlette's ``ServerErrorMiddleware`` is re-raised into uvicorn,
    which then closes the connection: a client's next keep-alive request failed. Here it is not."""

    def __init__(self, app, metrics: Metrics, allowed_hosts: tuple[str, ...] | None):
        self.app, self.metrics, self.allowed_hosts = app, metrics, allowed_hosts

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        start, status = time.perf_counter(), [500]
        started = [False]

        async def observed(message):
            if message["type"] == "http.response.start":
                status[0], started[0] = message["status"], True
            await send(message)

        try:
            host = dict(scope.get("headers") or []).get(b"host", b"").decode("latin-1")
            refusal = guard.host_refusal(host, self.allowed_hosts)
            if refusal is not None:
                await _error(400, refusal)(scope, receive, observed)
            else:
                await self.app(scope, receive, observed)
        except Exception as e:  # noqa: BLE001 -- a bug: one line to the client, the traceback to the log
            log.error("unexpected error on %s", scope.get("path"), exc_info=e)
            if not started[0]:
                body = _error(500, f"internal error ({type(e).__name__}); the server's log has the details")
                await body(scope, receive, observed)
        finally:
            route = scope.get("route")
            self.metrics.observe(getattr(route, "path", "other"), status[0], time.perf_counter() - start)


def _named_by_folder_name(message: str, workdir: str) -> str:
    """``message`` with the workdir named by its folder's name only, as ``/info`` names it: the refusals the
    server shares with the commands (``POST /sessions``' "no image was added to <workdir> ...", its child's
    lines) named the server's folders."""
    for path in dict.fromkeys((os.path.abspath(workdir), os.path.realpath(workdir))):
        message = message.replace(path, os.path.basename(path))
    return message


def _handlers() -> dict:
    """Exception class -> handler: each refusal one 4xx JSON line."""

    async def refused(request, e):
        return _error(e.status, str(e))

    async def busy(request, e: sessions.Busy):
        return _error(409, str(e))

    async def user_error(request, e: UserError):
        if isinstance(e, NotWritableError):  # the operator's to fix: the log names the path, the answer none
            log.error("%s: %s", request.url.path, e)
            return _error(
                503,
                f"the server cannot write to its workdir ({e.cause}); its operator must fix that, then retry. "
                f"Searching works meanwhile.",
            )
        unavailable = isinstance(e, (WorkdirBusyError, IndexUnavailableError))
        status = 409 if isinstance(e, Duplicate) else 503 if unavailable else 400
        return _error(status, _named_by_folder_name(str(e), _ctx(request).served.workdir))

    async def http_error(request, e: HTTPException):
        return _error(e.status_code, str(e.detail))

    async def invalid(request, e: RequestValidationError):
        first = e.errors()[0] if e.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()))
        return _error(400, f"{where}: {first.get('msg', 'invalid request')}")

    return {
        _Refused: refused,
        sessions.Busy: busy,
        uploads_lib.BadUpload: refused,
        UserError: user_error,
        HTTPException: http_error,
        RequestValidationError: invalid,
    }


@overload
async def _body(request: Request, ctx: Ctx, multipart: Literal[True]) -> FormData: ...
@overload
async def _body(request: Request, ctx: Ctx, multipart: Literal[False]) -> bytes: ...
async def _body(request: Request, ctx: Ctx, multipart: bool) -> FormData | bytes:
    """The request's form or body, read within ``read_timeout_s`` (a slow or stalled client gets 408)."""
    limits = ctx.limits
    if multipart:
        read = request.form(max_files=limits.max_images + 1, max_fields=32, max_part_size=limits.max_upload_bytes)
    else:
        read = request.body()
    try:
        return await asyncio.wait_for(read, limits.read_timeout_s)
    except asyncio.TimeoutError:
        raise _Refused(408, f"the request's body did not arrive within {limits.read_timeout_s:g} s.") from None


async def read_uploads(request: Request, ctx: Ctx) -> tuple[list[uploads_lib.Upload], dict[str, str]]:
    """The request's images (multipart files, or the raw body) decoded, and its form/query fields."""
    limits = ctx.limits
    length = request.headers.get("content-length")
    if length is None:
        raise _Refused(411, "send the request with a Content-Length header (no chunked uploads).")
    if not length.isdigit() or int(length) > limits.max_upload_bytes:
        raise _Refused(
            413, f"the request is {length} bytes, over the limit of {limits.max_upload_bytes} (--max_upload_mb)."
        )
    fields = dict(request.query_params)
    named: list[tuple[str, bytes]] = []
    if request.headers.get("content-type", "").startswith("multipart/form-data"):
        form = await _body(request, ctx, True)
        for key, value in form.multi_items():
            if isinstance(value, UploadFile):
                named.append((value.filename or f"image-{len(named)}", await value.read()))
            else:
                fields[key] = value
    else:
        named.append(("image-0", await _body(request, ctx, False)))
    if not named:
        raise _Refused(400, "no image in the request; send image files (multipart) or one image as the body.")
    if len(named) > limits.max_images:
        raise _Refused(413, f"{len(named)} images in one request, over the limit of {limits.max_images}.")
    shape = ctx.served.run.image_shape

    def decode():
        return [uploads_lib.decode(n, d, shape, limits.max_pixels) for n, d in named]

    if sum(len(d) for _, d in named) <= INLINE_DECODE_BYTES:
        return decode(), fields
    return await run_in_threadpool(decode), fields


def k_of(fields: dict[str, str], max_k: int) -> int:
    raw = fields.get("k", "5")
    k = parse_int(raw)
    if k is None or not 1 <= k <= max_k:
        raise _Refused(400, f"k={raw!r}: ask for 1 to {max_k} gallery rows per query (ASCII digits).")
    return k


async def search(request: Request):
    served = _ctx(request).served
    with served.batcher.arriving():  # a batch forming now waits for this request, not for nobody
        # One turn of the loop before deciding: requests already received (read together after the loop
        # ran a lone query itself) are counted first. Without it, a request whose body was buffered ran
        # start to end without yielding, saw itself alone and ran on the loop too: on one H200 the
        # server answered 16 clients one query at a time (180 queries/s, as for 1 client).
        await asyncio.sleep(0)
        return await answer(request)


async def answer(request: Request):
    ctx = _ctx(request)
    served = ctx.served
    got, fields = await read_uploads(request, ctx)
    k = k_of(fields, ctx.limits.max_k)
    label = fields.get("label") or None
    run = served.run
    label_value = run.label_of(label) if label is not None else None
    images = np.stack([u.image for u in got])
    query = Query(images, k, label_value)
    done, found = served.batcher.now(query, len(images))  # alone: answered here, without the hop
    if not done:
        found = await asyncio.wrap_future(served.batcher.submit(query, len(images)))
    queries = [
        {"query": u.name, "model_session": found.model_session, "hits": hits} for u, hits in zip(got, found.hits)
    ]
    out = {"model_session": found.model_session, "gallery_rows": found.gallery_rows, "queries": queries}
    if _bool(fields.get("html")):
        shown = [
            {
                "query": u.name,
                "class_name": search_page.query_class(u.name, label, run.class_names) if label else None,
                "image": u.image,
                "error": None,
                "hits": hits,
            }
            for u, hits in zip(got, found.hits)
        ]
        out["html"] = page.hits_html(shown)
    return JSONResponse(out)  # plain JSON types already: FastAPI's encoder pass would only cost time


def _check_write(request: Request, ctx: Ctx) -> None:
    refusal = guard.write_refusal(request.headers, ctx.token)
    if refusal is not None:
        raise _Refused(*refusal)


def _check_run_writable(ctx: Ctx) -> None:
    """``/add`` and ``POST /sessions`` write into the run: on a run served read-only, one 403 (not a 503 per
    try: the run stays read-only for this server), naming no server path."""
    if ctx.served.read_only is not None:
        raise _Refused(
            403,
            f"this server serves a read-only run ({ctx.served.read_only}): adding rows and training sessions are "
            "off, searching works. To add, its operator serves a writable copy of the run.",
        )


async def add(request: Request):
    ctx = _ctx(request)
    _check_write(request, ctx)
    _check_run_writable(ctx)
    got, fields = await read_uploads(request, ctx)
    label = fields.get("label")
    if label == "":  # label=$UNSET in a script: rows silently unlabelled, never learnt (search --add refuses it)
        raise _Refused(
            400, "label= is empty: pass the class name (label=NAME), or leave label out to add unlabelled rows."
        )
    out = await run_in_threadpool(ctx.served.add, got, label, _bool(fields.get("force")))
    if ctx.sessions.learn_after is not None and out.get("label", -1) >= 0:
        out["session_started"] = await run_in_threadpool(ctx.sessions.after_add, ctx.served.added_now())
    return out


async def pin_model(request: Request):
    """``POST /model?session=N``: serve the model of completed session N (past the gate, or a rollback);
    ``session=newest``: follow the newest session again, through the gate."""
    ctx = _ctx(request)
    _check_write(request, ctx)
    raw = request.query_params.get("session", "")
    if raw == "newest":
        return await run_in_threadpool(ctx.served.pin, None)
    n = parse_int(raw)
    if n is None or n < 1:
        raise _Refused(400, f"session={raw!r}: pass a completed session's number (1, 2, ...) or 'newest'.")
    return await run_in_threadpool(ctx.served.pin, n - 1)


async def start_session(request: Request):
    """``POST /sessions``: the next session from the labelled adds, in a child process (``serve/sessions.py``)."""
    ctx = _ctx(request)
    _check_write(request, ctx)
    _check_run_writable(ctx)
    return await run_in_threadpool(ctx.sessions.start)


async def current_session(request: Request):
    return _ctx(request).sessions.current()


async def info(request: Request):
    served = _ctx(request).served
    out = await run_in_threadpool(run_info.describe_run, served.run)
    out["workdir"] = os.path.basename(os.path.abspath(served.workdir))  # no server folder in an answer
    out.update(served.status())
    return out


async def healthz(request: Request):
    served = _ctx(request).served
    return {"status": "ok", "model_session": served.model_session, "gallery_rows": len(served.run.rows)}


async def prometheus(request: Request):
    ctx = _ctx(request)
    served = ctx.served
    gauges: dict[str, tuple[str, float]] = {
        "cvs_gallery_rows": ("Rows searched (session rows and added rows).", len(served.run.rows)),
        "cvs_model_session": ("The session (1-based) whose model embeds the queries.", served.model_session),
        "cvs_model_switches_total": ("Switches to a newer session since the start.", served.switches),
        "cvs_index_rows": ("Rows held by the index.", len(served.index)),
    }
    sizes = served.batcher.batch_sizes
    if sizes:
        gauges["cvs_batch_images_mean"] = ("Images per batch, mean of the last 1000.", float(np.mean(sizes)))
    counters = {"cvs_gate_decisions_total": ("Gate verdicts on new sessions, by decision.", served.gate_counts)}
    session, states = sessions.gauges(ctx.sessions.current())
    gauges.update(session)
    return Response(ctx.metrics.text(gauges, counters, states), media_type="text/plain; version=0.0.4")


async def index_page(request: Request):
    ctx = _ctx(request)
    served = ctx.served
    return HTMLResponse(
        page.render(
            workdir=os.path.basename(os.path.abspath(served.workdir)),
            model_session=served.model_session,
            gallery_rows=len(served.run.rows),
            k=5,
            max_k=ctx.limits.max_k,
            has_report=os.path.exists(paths.report_file(served.workdir)),
            session=ctx.sessions.current(),
        )
    )


async def report(request: Request):
    path = paths.report_file(_ctx(request).served.workdir)
    if not os.path.exists(path):
        raise _Refused(404, "the run has no report.html yet (python -m cvs_jax.report writes it).")
    return FileResponse(path, media_type="text/html")


async def thumb(request: Request):
    """``/thumb/<id>.png``: a row's stored image by its id (``"id"`` of a hit; a session row's id is also
    its row number)."""
    run = _ctx(request).served.run
    raw = request.path_params["row_id"]
    row_id = parse_int(raw)
    row = run.row_of_id(row_id) if row_id is not None else None
    if row is None:
        raise _Refused(404, f'id {raw}: no gallery row has it (a hit\'s "id" names its row).')
    image = (await run_in_threadpool(run.row_images, [row]))[0]
    if image is None:
        raise _Refused(404, f"id {raw}: its image cannot be read on this machine.")
    arr = image[..., 0] if image.ndim == 3 and image.shape[-1] == 1 else image
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="PNG")
    return Response(buf.getvalue(), media_type="image/png", headers={"Cache-Control": "max-age=3600"})


ROUTES = (
    ("/search", search, ["POST"]),
    ("/add", add, ["POST"]),
    ("/model", pin_model, ["POST"]),
    ("/sessions", start_session, ["POST"]),
    ("/sessions/current", current_session, ["GET"]),
    ("/info", info, ["GET"]),
    ("/healthz", healthz, ["GET"]),
    ("/metrics", prometheus, ["GET"]),
    ("/", index_page, ["GET"]),
    ("/report.html", report, ["GET"]),
    ("/thumb/{row_id}.png", thumb, ["GET"]),
)


def create_app(
    served: Served,
    *,
    token: str | None = None,
    limits: Limits = Limits(),
    allowed_hosts: tuple[str, ...] | None = None,
    learn_after: int | None = None,
) -> FastAPI:
    """The app over a loaded ``Served``; ``token``: required (Bearer) for ``/add`` and ``/model`` when set;
    ``allowed_hosts``: the ``Host`` names answered (None: any; the command passes loopback names by default);
    ``learn_after``: an add that brings the labelled images pending to this many starts the next session."""
    app = FastAPI(title="cvs_jax visual search", docs_url=None, redoc_url=None, openapi_url=None)
    metrics = Metrics()
    app.state.ctx = Ctx(served, token, limits, metrics, allowed_hosts, sessions.SessionJob(served.workdir, learn_after))
    app.add_middleware(_Observe, metrics=metrics, allowed_hosts=allowed_hosts)
    for cls, handler in _handlers().items():
        app.add_exception_handler(cls, handler)
    for path, endpoint, methods in ROUTES:
        app.add_api_route(path, endpoint, methods=methods)
    return app
