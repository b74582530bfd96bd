"""A real Milvus server (standalone, from the PyPI package ``milvus``: the ``milvus_server`` extra) on
free loopback ports in a folder of its own, for the tests of several ``serve`` replicas on one collection.

The clients use 127.0.0.1, but Milvus itself listens on every interface (its ports are free ones the
package picks from its defaults: 19530 for the proxy, and so on).  ``kill()`` ends it as ``kill -9``
does (no shutdown, nothing flushed); ``start()`` again brings it back on the same ports and the same
data folder, so clients holding its URI reconnect.
"""

from __future__ import annotations

import os
import signal
import subprocess


class MilvusServer:
    """``with MilvusServer(folder) as m: m.uri``; raises ImportError where the ``milvus`` package is absent."""

    def __init__(self, folder: str, start_timeout_s: float = 120.0):
        # the milvus_server extra, which dev (and so pyright's environment) leaves out
        import milvus  # pylint: disable=g-import-not-at-top  # pyright: ignore[reportMissingImports]

        self._milvus = milvus
        self._folder = os.path.abspath(folder)
        self._timeout_ms = int(start_timeout_s * 1000)
        self._ports: dict[str, int] = {}
        self._env: dict[str, str] = {}
        self._server = None
        self.uri = ""

    def start(self) -> MilvusServer:
        """The first start lets the package pick free ports and write the config; a restart runs the same
        binary on that config (the package would refuse ports still in TIME_WAIT after a kill)."""
        if self._server is None and not self._ports:
            server = self._milvus.MilvusServer(self._milvus.MilvusServerConfig(), wait_for_started=False)
            server.set_base_dir(self._folder)
            server.start()
            config = server.config
            self._ports = {k: int(config.get(k)) for k in config.configurable_items if k.endswith("_port")}
            self._env = {"DEPLOY_MODE": "STANDALONE", "METRICS_PORT": str(server.webservice_port)}
            self._env["MILVUS_RUN_DIR"] = os.path.join(self._folder, "run")
        else:
            server = self._milvus.MilvusServer(wait_for_started=False)
            server.config.base_data_dir, server.webservice_port = self._folder, int(self._env["METRICS_PORT"])
            env = {**os.environ, **self._env}
            exe = server.get_milvus_executable_path()
            env["LD_LIBRARY_PATH"] = os.path.dirname(exe) + ":" + os.environ.get("LD_LIBRARY_PATH", "")
            for name in ("stdout", "stderr"):
                server.proc_fds[name] = open(os.path.join(self._folder, "logs", f"milvus-{name}.log"), "a")  # noqa: SIM115
            out, err = server.proc_fds["stdout"], server.proc_fds["stderr"]
            server.server_proc = subprocess.Popen(
                [exe, "run", "standalone"], cwd=self._folder, env=env, stdout=out, stderr=err
            )
        self._server = server
        try:
            server.wait_started(timeout=self._timeout_ms)
        except BaseException:
            self.kill()
            raise
        self.uri = f"http://127.0.0.1:{self._ports['proxy_port']}"
        return self

    @property
    def pid(self) -> int:
        assert self._server is not None  # started
        return self._server.server_proc.pid

    def kill(self) -> None:
        """SIGKILL, as ``kill -9``: the server gets no chance to flush or say goodbye."""
        if self._server is None:
            return
        proc = self._server.server_proc
        if proc is not None and proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        self._close()

    def stop(self) -> None:
        if self._server is None:
            return
        proc = self._server.server_proc
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()
                return
        self._close()

    def _close(self) -> None:
        server = self._server
        if server is None:  # kill and stop look first
            return
        for fd in server.proc_fds.values():
            fd.close()
        server.proc_fds.clear()
        server.server_proc = None
        self._server = None

    def log_tail(self, n: int = 20) -> str:
        """The server's last log lines (a failed test shows them)."""
        path = os.path.join(self._folder, "logs", "milvus-stdout.log")
        if not os.path.exists(path):
            return ""
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-n:])

    def __enter__(self) -> MilvusServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
