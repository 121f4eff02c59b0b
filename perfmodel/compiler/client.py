"""The caller's side of the compile server: a pool of long-lived servers, one per concurrent compile.

:func:`ask` sends one request to an idle server started with the same
environment (or starts one: about 2 s, once per process and environment) and
returns its answer. A server that crashed, hung or answered garbage is killed
and not reused; the others live until the caller exits.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

from perfmodel.errors import ToolFailure

#: Seconds a server may take to import jax and say it is ready.
START_TIMEOUT_S = 120.0
#: Seconds past a request's own timeout (which the server enforces) before the caller gives up on the server.
GRACE_S = 60.0


class ServerFailed(ToolFailure):
    """A compile server died, hung or answered something that is not an answer."""


class _Server:
    def __init__(self, env: dict[str, str]):
        self.stderr = tempfile.TemporaryFile()
        self.proc = subprocess.Popen([sys.executable, "-m", "perfmodel.compiler.server"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.stderr, env=env)
        self._buf = b""
        ready = self._read_line(time.monotonic() + START_TIMEOUT_S)
        if not ready.get("ready"):
            self.close()
            raise ServerFailed(f"the compile server did not start: {ready}")

    def _stderr_tail(self) -> str:
        try:
            self.stderr.seek(0)
            lines = [ln for ln in self.stderr.read().decode(errors="replace").splitlines() if ln.strip()]
        except (OSError, ValueError):  # closed already
            return "no output"
        return lines[-1][:300] if lines else "no output"

    def _read_line(self, deadline: float) -> dict[str, Any]:
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                self.close()
                raise ServerFailed("the compile server stopped answering; it was killed")
            ready, _, _ = select.select([fd], [], [], min(left, 1.0))
            if not ready:
                continue
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                tail = self._stderr_tail()
                self.close()
                raise ServerFailed(f"the compile server exited (code {self.proc.returncode}): {tail}")
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        try:
            return json.loads(line)
        except ValueError:
            self.close()
            raise ServerFailed(f"the compile server answered something else: {line[:200]!r}") from None

    def ask(self, request: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        try:
            self.proc.stdin.write(json.dumps({**request, "timeout_s": timeout_s}).encode() + b"\n")
            self.proc.stdin.flush()
        except OSError:
            tail = self._stderr_tail()
            self.close()
            raise ServerFailed(f"the compile server is gone: {tail}") from None
        return self._read_line(time.monotonic() + timeout_s + GRACE_S)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.stderr.close()


_LOCK = threading.Lock()
_IDLE: dict[tuple[tuple[str, str], ...], list[_Server]] = {}
_ALL: list[_Server] = []


def _close_all() -> None:
    for server in list(_ALL):
        if server.alive():
            server.close()
    _ALL.clear()
    _IDLE.clear()


atexit.register(_close_all)


#: Environment variables a server's compiles depend on (flags, module search, perfmodel's own settings); the rest
#: (pytest's PYTEST_CURRENT_TEST, ...) changes between calls and must not start a new server each time.
_SERVER_ENV_PREFIXES = ("JAX_", "XLA_", "LIBTPU", "TPU_", "PERFMODEL_", "PYTHON", "ALLOW_MULTIPLE_LIBTPU_LOAD")


def _fingerprint(env: dict[str, str]) -> tuple[tuple[str, str], ...]:
    return (("cwd", os.getcwd()), ("python", sys.executable),
            *sorted((k, v) for k, v in env.items() if k.startswith(_SERVER_ENV_PREFIXES)))


def ask(request: dict[str, Any], env: dict[str, str], timeout_s: float) -> dict[str, Any]:
    """One request answered by an idle server of this environment (started when none is idle; idle servers of
    another environment are closed then, so a caller that changes its environment keeps no stale servers)."""
    fingerprint = _fingerprint(env)
    stale: list[_Server] = []
    with _LOCK:
        idle = _IDLE.setdefault(fingerprint, [])
        server = idle.pop() if idle else None
        if server is None:
            for other in [f for f in _IDLE if f != fingerprint]:
                stale += _IDLE.pop(other)
    for old in stale:
        old.close()
    if stale:
        with _LOCK:
            _ALL[:] = [s for s in _ALL if s.alive()]
    if server is None or not server.alive():
        server = _Server(env)
        with _LOCK:
            _ALL.append(server)
    answer = server.ask(request, timeout_s)
    with _LOCK:
        _IDLE.setdefault(fingerprint, []).append(server)
    return answer


def servers_running() -> int:
    """Servers of this process still running (tests: one per concurrent compile, not one per compile or test)."""
    return sum(1 for s in _ALL if s.alive())

