"""``python -m cvs_jax.serve`` as a process for tests and benchmarks: a free port, start, wait, stop."""

from __future__ import annotations

import functools
import signal
import socket
import subprocess
import sys
import time

import httpx


@functools.cache
def http() -> httpx.Client:
    """One client for the process's requests to local servers. ``httpx.get``/``httpx.post`` build a client,
    and with it a TLS context that reads the CA bundle, on every call: under cProfile, 321 calls of the serve
    tests took 18 s, some of them polling a starting server. No keep-alive: each request opens its own
    connection, as those calls did, so a restarted or killed server never meets a stale pooled one."""
    return httpx.Client(limits=httpx.Limits(max_keepalive_connections=0))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(
    workdir: str, port: int, log, *flags: str, timeout_s: float = 300, cwd: str | None = None, env: dict | None = None
) -> subprocess.Popen:
    """Starts the server and returns once ``/healthz`` answers (the run is loaded, the model compiled).
    ``cwd`` and ``env``: another checkout's server (``benchmarks/serve_ab.py``)."""
    cmd = [sys.executable, "-m", "cvs_jax.serve", "--workdir", workdir, "--port", str(port), *flags]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=cwd, env=env)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"the server exited while starting (status {proc.returncode})")
        try:
            if http().get(f"http://127.0.0.1:{port}/healthz", timeout=5).status_code == 200:
                return proc
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise AssertionError(f"the server did not answer /healthz within {timeout_s:.0f} s")


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM (uvicorn's graceful shutdown), then SIGKILL if it lingers."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=60)
