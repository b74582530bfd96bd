"""Serve a run's visual search over HTTP while it keeps learning.

    python -m cvs_jax.serve --workdir W [--host 127.0.0.1] [--port 8000] [--token_file F] [--gate on|off]

Example: ``python -m cvs_jax.serve --workdir workdirs/demo/cvs``, then open http://127.0.0.1:8000/ or
``curl -F file=@q.png 'http://127.0.0.1:8000/search?k=3'``.

It loads the newest completed session once (model, gallery, added rows) and answers ``POST /search``,
``POST /add``, ``GET /info``, ``/healthz``, ``/metrics`` and the page ``/``.  When ``update`` completes
a session in the workdir, the server switches to its model and adds its gallery part without a
restart (``state.py``).  Bound to an address other than 127.0.0.1/localhost/::1 it refuses to start
without a token (``--token`` or the environment variable ``CVS_JAX_TOKEN``), which ``/add`` then requires.
A problem to fix ends with one ``error: ...`` line and exit status 2.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import logging
import os
import re
import socket
import sys
from typing import Any, Callable

import numpy as np
from absl import flags

from cvs_jax import cli
from cvs_jax.errors import UserError
from cvs_jax.index import registry
from cvs_jax.index.registry import INDEXES
from cvs_jax.retrieval import gate
from cvs_jax.serve import guard

TOKEN_ENV = "CVS_JAX_TOKEN"
LOOPBACK = ("127.0.0.1", "localhost", "::1")


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
    flags.DEFINE_string("workdir", None, "The --workdir of a run of python -m cvs_jax.main.", flag_values=flag_values)
    flags.DEFINE_string(
        "host", "127.0.0.1", "Address to bind (other than loopback: needs a token).", flag_values=flag_values
    )
    flags.DEFINE_integer("port", 8000, "Port to listen on.", flag_values=flag_values)
    flags.DEFINE_string(
        "token",
        None,
        f"Token that POST /add and /model require (default: ${TOKEN_ENV}, if set; visible in ps: prefer "
        "--token_file or the environment variable).",
        flag_values=flag_values,
    )
    flags.DEFINE_string("token_file", None, "A file whose first line is the token.", flag_values=flag_values)
    flags.DEFINE_list(
        "allowed_hosts",
        None,
        "Host names the server answers (the Host header; against DNS rebinding). Default: the loopback names "
        "and --host; '*': any.",
        flag_values=flag_values,
    )
    flags.DEFINE_float(
        "read_timeout_s", 30.0, "A request's head, then its body, must arrive within this.", flag_values=flag_values
    )
    flags.DEFINE_enum("gate", "on", ["on", "off"], "The compatibility gate on each switch.", flag_values=flag_values)
    flags.DEFINE_float(
        "gate_bc", gate.DEFAULT_BC, "Switch only when BC >= -gate_bc (recall@1 points).", flag_values=flag_values
    )
    flags.DEFINE_float(
        "gate_nfr", gate.DEFAULT_NFR, "Switch only when NFR <= gate_nfr (% of probe queries).", flag_values=flag_values
    )
    flags.DEFINE_float("max_upload_mb", 20.0, "Largest request body, in MiB.", flag_values=flag_values)
    flags.DEFINE_integer("max_images", 16, "Most images in one request.", flag_values=flag_values)
    flags.DEFINE_integer(
        "learn_after",
        None,
        "Start the next session (POST /sessions) by itself once it would learn from this many labelled added "
        "images (a lone image of a class waits, uncounted; default: off).",
        lower_bound=1,
        flag_values=flag_values,
    )
    flags.DEFINE_integer(
        "max_pixels", 40_000_000, "Most pixels of one image (read from its header).", flag_values=flag_values
    )
    flags.DEFINE_float("max_wait_ms", 5.0, "Longest a query waits for others to batch with.", flag_values=flag_values)
    flags.DEFINE_integer("max_batch", 64, "Most images embedded and searched in one batch.", flag_values=flag_values)
    flags.DEFINE_float(
        "poll_s", 1.0, "How often the workdir is checked for a new session or added rows.", flag_values=flag_values
    )
    flags.DEFINE_enum(
        "index",
        "exact",
        list(INDEXES),
        "Where the gallery is searched: exact top-K in the process (default), faiss-hnsw / faiss-ivf for big "
        "galleries on a CPU, or milvus (Milvus Lite on a local file, or a Milvus cluster by its URI).",
        flag_values=flag_values,
    )
    flags.DEFINE_string(
        "milvus-uri",
        None,
        "With --index milvus: a local file (Milvus Lite) or http://host:19530.",
        flag_values=flag_values,
    )
    flags.DEFINE_string(
        "milvus-collection",
        None,
        "With --index milvus: the collection (default: named after the run's folder, so two runs never share one); "
        "a gallery re-embedded by a joint session goes to <collection>_g<session>.",
        flag_values=flag_values,
    )
    flags.DEFINE_string(
        "milvus-token", None, "With --index milvus: the cluster's token (or env MILVUS_TOKEN).", flag_values=flag_values
    )
    flags.mark_flags_as_required(["workdir"], flag_values=flag_values)


def check_token(host: str, token: str | None, token_file: str | None = None) -> str | None:
    """The token ``/add`` and ``/model`` require (``--token``, ``--token_file``, ``$CVS_JAX_TOKEN``);
    refuses a non-loopback address without one."""
    if token_file:
        try:
            with open(token_file, encoding="utf-8") as f:
                token = f.readline().strip() or None
        except OSError as e:
            raise UserError(f"--token_file {token_file}: cannot read it ({e.strerror}); pass a readable file.") from e
        if token is None:
            raise UserError(f"--token_file {token_file} is empty; write the token on its first line.")
    token = token or os.environ.get(TOKEN_ENV) or None
    if host not in LOOPBACK and token is None:
        raise UserError(
            f"--host {host} lets other machines reach the server; set a token for /add with --token T or "
            f"{TOKEN_ENV}=T (clients send 'Authorization: Bearer T'), or bind to 127.0.0.1."
        )
    return token


def allowed_hosts(host: str, given: list[str] | None) -> tuple[str, ...] | None:
    """The Host names answered: ``given`` ('*': any), else the loopback names and ``host``."""
    if given:
        return None if "*" in given else tuple(h.lower() for h in given)
    extra = () if host in ("0.0.0.0", "::", "") else (host.lower(),)
    return tuple(dict.fromkeys(guard.LOOPBACK_HOSTS + extra))


def check_limits(fv) -> None:
    """Refuses a count below 1, or a size or time that is not positive (``--poll_s 0`` spun a core listing
    the workdir; ``--max_upload_mb 0`` refused every request), before the run is loaded."""
    for name in ("max_images", "max_pixels", "max_batch"):
        if fv[name].value < 1:
            raise UserError(f"--{name}={fv[name].value}: pass a positive number.")
    for name in ("max_upload_mb", "read_timeout_s", "poll_s"):
        if not fv[name].value > 0:  # also NaN
            raise UserError(f"--{name}={fv[name].value}: pass a positive number (default {fv[name].default}).")
    if not fv.max_wait_ms >= 0:
        raise UserError(f"--max_wait_ms={fv.max_wait_ms}: pass 0 (no batching wait) or more.")


def check_port(host: str, port: int) -> None:
    """Refuses a port out of range, in use, or an address this machine lacks, before the run is loaded
    (which takes a while); the fix named is the one for the cause."""
    if not 1 <= port <= 65535:
        raise UserError(f"--port {port} is not a TCP port; pass one of 1 to 65535 (default 8000).")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            if e.errno in (errno.EADDRINUSE, errno.EACCES):
                fix = "stop what uses it, or pass another --port" + (
                    " (ports below 1024 need root)" if port < 1024 else ""
                )
            else:
                fix = "pass a --host this machine has: 127.0.0.1 (this machine only) or 0.0.0.0 (every address)"
            raise UserError(f"cannot listen on {host}:{port} ({e.strerror}); {fix}.") from e


def default_collection(workdir: str) -> str:
    """A Milvus collection name of this run's folder (letters, digits, _), with a hash of its full path."""
    path = os.path.realpath(workdir)
    name = re.sub(r"[^A-Za-z0-9_]", "_", os.path.basename(path))[:40]
    return f"cvs_{name}_{hashlib.sha256(path.encode()).hexdigest()[:8]}"


def index_factory(fv) -> Callable[..., Any]:
    """``(dim, generation=0) -> index`` for ``--index`` (``cvs_jax.index.registry``), its options checked
    before anything loads."""
    kind = fv.index
    options: dict[str, Any] = {}
    if kind == "milvus":
        uri = fv["milvus-uri"].value
        if not uri:
            raise UserError("--index milvus needs --milvus-uri: a local file for Milvus Lite, or http://host:19530.")
        token = fv["milvus-token"].value or os.environ.get("MILVUS_TOKEN")
        collection = fv["milvus-collection"].value or default_collection(fv.workdir)
        options = {"uri": uri, "collection": collection, **({"token": token} if token else {})}
    return functools.partial(registry.make_index, kind, **options)


def recall_check(served, sample: int = 200, k: int = 10) -> float:
    """recall@k of the served index against exact search, with up to ``sample`` gallery rows as queries."""
    rows = served.run.gallery.embeddings  # may be the parts' rows in a row (contiguous slices only)
    pick = np.sort(np.random.default_rng(0).choice(len(rows), size=min(sample, len(rows)), replace=False))
    queries = np.stack([np.asarray(rows[int(i) : int(i) + 1])[0] for i in pick])
    return registry.measured_recall(served.index, served.exact_copy(), queries, k)


@cli.command
def main(argv: list[str], flag_values: flags.FlagValues = flags.FLAGS) -> int:
    fv = flag_values
    cli.quiet_logging()
    if len(argv) > 1:
        raise UserError(f"unexpected arguments {' '.join(argv[1:])}; pass --workdir (and --host, --port).")
    token = check_token(fv.host, fv.token, fv.token_file)
    check_limits(fv)
    check_port(fv.host, fv.port)
    import uvicorn  # pylint: disable=g-import-not-at-top  # the serve extra

    from cvs_jax.serve import protocol  # pylint: disable=g-import-not-at-top
    from cvs_jax.serve.app import Limits, create_app  # pylint: disable=g-import-not-at-top
    from cvs_jax.serve.state import Served  # pylint: disable=g-import-not-at-top

    logging.getLogger("cvs_jax.serve").setLevel(logging.INFO)
    from PIL import Image  # pylint: disable=g-import-not-at-top

    Image.MAX_IMAGE_PIXELS = fv.max_pixels  # Pillow's own guard, besides the header check of each upload
    make_index = index_factory(fv)
    served = Served(
        fv.workdir,
        make_index=make_index,
        max_wait_s=fv.max_wait_ms / 1000,
        max_batch=fv.max_batch,
        poll_s=fv.poll_s,
        thresholds=gate.Thresholds(bc=fv.gate_bc, nfr=fv.gate_nfr, off=fv.gate == "off"),
        warm_all=True,
        announce=lambda line: print(line, file=sys.stderr, flush=True),  # the compiles take a while: say so first
    )
    if fv.index != "exact":  # an approximate index says how close it is, on the gallery's own rows as queries
        print(f"index {fv.index}: recall@10 against exact search {recall_check(served):.3f}", file=sys.stderr)
    limits = Limits(
        max_upload_bytes=int(fv.max_upload_mb * (1 << 20)),
        max_images=fv.max_images,
        max_pixels=fv.max_pixels,
        read_timeout_s=fv.read_timeout_s,
    )
    app = create_app(
        served,
        token=token,
        limits=limits,
        allowed_hosts=allowed_hosts(fv.host, fv.allowed_hosts),
        learn_after=fv.learn_after,
    )
    print(
        f"serving {fv.workdir} (model of session {served.model_session}, {len(served.run.rows)} rows) on "
        f"http://{fv.host}:{fv.port}/",
        file=sys.stderr,
        flush=True,
    )
    try:
        uvicorn.run(
            app,
            host=fv.host,
            port=fv.port,
            log_level="warning",
            http=protocol.with_head_deadline(fv.read_timeout_s),
            timeout_keep_alive=5,
        )
    finally:
        served.close()
    return 0


if __name__ == "__main__":
    cli.run(main, define_flags)
