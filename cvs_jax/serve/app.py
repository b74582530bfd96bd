"""The HTTP routes (FastAPI on Starlette): search, add, info, health, metrics, the page, thumbnails.

Every refusal is a 4xx JSON ``{"error": "..."}`` with one message, and anything unexpected a 500 with
one line (the traceback goes to the server's log, never to the client); the server keeps serving.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import io
import logging
import os
import time

import numpy as np
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, Response
from PIL import Image
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException

from cvs_jax.errors import UserError, WorkdirBusyError
from cvs_jax.reports import search_page
from cvs_jax.retrieval import run_info
from cvs_jax.rundir import paths
from cvs_jax.serve import page
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


# uploads up to this size are decoded on the event loop (a small PNG decodes in 0.07 ms, less than a hop
# to the thread pool); bigger ones, whose decoding would stall other requests, in the thread pool
INLINE_DECODE_BYTES = 64 << 10


class _Refused(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def _bool(value: str | None) -> bool:
    return value is not None and value.lower() in ("1", "true", "yes", "on")


class _Observe:
    """Counts every answer and its latency per route (``/metrics``).  A plain ASGI middleware: Starlette's
    ``@app.middleware("http")`` wraps each request in extra tasks and streams, which cost a lone query
    about 0.3 ms here."""

    def __init__(self, app, metrics: Metrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        start, status = time.perf_counter(), [500]

        async def observed(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, observed)
        finally:
            route = scope.get("route")
            self.metrics.observe(getattr(route, "path", "other"), status[0], time.perf_counter() - start)


def create_app(served: Served, *, token: str | None = None, limits: Limits = Limits()) -> FastAPI:
    """The app over a loaded ``Served``; ``token``: required (Bearer) for ``/add`` when set."""
    app = FastAPI(title="cvs_jax visual search", docs_url=None, redoc_url=None, openapi_url=None)
    metrics = Metrics()

    app.add_middleware(_Observe, metrics=metrics)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, e: Exception):  # a bug: one line to the client, the traceback to the log
        log.error("unexpected error on %s", request.url.path, exc_info=e)
        return _error(500, f"internal error ({type(e).__name__}); the server's log has the details")

    @app.exception_handler(_Refused)
    async def refused(request, e: _Refused):
        return _error(e.status, str(e))

    @app.exception_handler(uploads_lib.BadUpload)
    async def bad_upload(request, e: uploads_lib.BadUpload):
        return _error(e.status, str(e))

    @app.exception_handler(UserError)
    async def user_error(request, e: UserError):
        status = 409 if isinstance(e, Duplicate) else 503 if isinstance(e, WorkdirBusyError) else 400
        return _error(status, str(e))

    @app.exception_handler(HTTPException)
    async def http_error(request, e: HTTPException):
        return _error(e.status_code, str(e.detail))

    @app.exception_handler(RequestValidationError)
    async def invalid(request, e: RequestValidationError):
        first = e.errors()[0] if e.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()))
        return _error(400, f"{where}: {first.get('msg', 'invalid request')}")

    async def read_uploads(request: Request) -> tuple[list[uploads_lib.Upload], dict[str, str]]:
        """The request's images (multipart files, or the raw body) decoded, and its form/query fields."""
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
            form = await request.form(
                max_files=limits.max_images + 1, max_fields=32, max_part_size=limits.max_upload_bytes
            )
            for key, value in form.multi_items():
                if isinstance(value, UploadFile):
                    named.append((value.filename or f"image-{len(named)}", await value.read()))
                else:
                    fields[key] = value
        else:
            named.append(("image-0", await request.body()))
        if not named:
            raise _Refused(400, "no image in the request; send image files (multipart) or one image as the body.")
        if len(named) > limits.max_images:
            raise _Refused(413, f"{len(named)} images in one request, over the limit of {limits.max_images}.")
        shape = served.run.image_shape

        def decode():
            return [uploads_lib.decode(n, d, shape, limits.max_pixels) for n, d in named]

        if sum(len(d) for _, d in named) <= INLINE_DECODE_BYTES:
            return decode(), fields
        return await run_in_threadpool(decode), fields

    def k_of(fields: dict[str, str]) -> int:
        raw = fields.get("k", "5")
        if not raw.lstrip("-").isdigit() or not 1 <= int(raw) <= limits.max_k:
            raise _Refused(400, f"k={raw!r}: ask for 1 to {limits.max_k} gallery rows per query.")
        return int(raw)

    @app.post("/search")
    async def search(request: Request):
        with served.batcher.arriving():  # a batch forming now waits for this request, not for nobody
            # One turn of the loop before deciding: requests already received (read together after the loop
            # ran a lone query itself) are counted first. Without it, a request whose body was buffered ran
            # start to end without yielding, saw itself alone and ran on the loop too: on one H200 the
            # server answered 16 clients one query at a time (180 queries/s, as for 1 client).
            await asyncio.sleep(0)
            return await answer(request)

    async def answer(request: Request):
        got, fields = await read_uploads(request)
        k = k_of(fields)
        label = fields.get("label") or None
        run = served.run
        label_value = run.label_of(label) if label is not None else None
        images = np.stack([u.image for u in got])
        query = Query(images, k, label_value)
        done, answer = served.batcher.now(query, len(images))  # alone: answered here, without the hop
        if not done:
            answer = await asyncio.wrap_future(served.batcher.submit(query, len(images)))
        queries = [
            {"query": u.name, "model_session": answer.model_session, "hits": hits} for u, hits in zip(got, answer.hits)
        ]
        out = {"model_session": answer.model_session, "gallery_rows": answer.gallery_rows, "queries": queries}
        if _bool(fields.get("html")):
            shown = [
                {
                    "query": u.name,
                    "class_name": search_page.query_class(u.name, label, run.class_names) if label else None,
                    "image": u.image,
                    "error": None,
                    "hits": hits,
                }
                for u, hits in zip(got, answer.hits)
            ]
            out["html"] = page.hits_html(shown)
        return JSONResponse(out)  # plain JSON types already: FastAPI's encoder pass would only cost time

    @app.post("/add")
    async def add(request: Request):
        if token is not None:
            given = request.headers.get("authorization", "")
            if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
                raise _Refused(401, "adding rows needs the server's token: send 'Authorization: Bearer TOKEN'.")
        got, fields = await read_uploads(request)
        return await run_in_threadpool(served.add, got, fields.get("label") or None, _bool(fields.get("force")))

    @app.get("/info")
    async def info():
        return await run_in_threadpool(run_info.describe_run, served.run)

    @app.get("/healthz")
    async def healthz():
        return {"status": "ok", "model_session": served.model_session, "gallery_rows": len(served.run.rows)}

    @app.get("/metrics")
    async def prometheus():
        gauges = {
            "cvs_gallery_rows": ("Rows searched (session rows and added rows).", len(served.run.rows)),
            "cvs_model_session": ("The session (1-based) whose model embeds the queries.", served.model_session),
            "cvs_model_switches_total": ("Switches to a newer session since the start.", served.switches),
            "cvs_index_rows": ("Rows held by the index.", len(served.index)),
        }
        sizes = served.batcher.batch_sizes
        if sizes:
            gauges["cvs_batch_images_mean"] = ("Images per batch, mean of the last 1000.", float(np.mean(sizes)))
        return Response(metrics.text(gauges), media_type="text/plain; version=0.0.4")

    @app.get("/")
    async def index_page():
        run = served.run
        return HTMLResponse(
            page.render(
                workdir=os.path.abspath(served.workdir),
                model_session=served.model_session,
                gallery_rows=len(run.rows),
                k=5,
                max_k=limits.max_k,
                has_report=os.path.exists(paths.report_file(served.workdir)),
            )
        )

    @app.get("/report.html")
    async def report():
        path = paths.report_file(served.workdir)
        if not os.path.exists(path):
            raise _Refused(404, "the run has no report.html yet (python -m cvs_jax.report writes it).")
        return FileResponse(path, media_type="text/html")

    @app.get("/thumb/{row}.png")
    async def thumb(row: int):
        run = served.run
        if not 0 <= row < len(run.rows):
            raise _Refused(404, f"row {row}: the gallery has rows 0 to {len(run.rows) - 1}.")
        image = (await run_in_threadpool(run.row_images, [row]))[0]
        if image is None:
            raise _Refused(404, f"row {row}: its image cannot be read on this machine.")
        arr = image[..., 0] if image.ndim == 3 and image.shape[-1] == 1 else image
        buf = io.BytesIO()
        Image.fromarray(arr).save(buf, format="PNG")
        return Response(buf.getvalue(), media_type="image/png", headers={"Cache-Control": "max-age=3600"})

    return app
