"""A long-lived compile server: imports jax once, forks one process per compile.

``python -m perfmodel.compiler.server`` reads one JSON request per line on
stdin and answers one JSON line on stdout (``{"ready": true}`` first). For each
request it forks a child that sets libtpu's flags (its own ``--xla_jf_dump_to``
folder, or the request's ``dump_dir``), compiles through :func:`perfmodel.compiler.worker.run_request` and
writes its answer to a file; the server waits for it (killing it past the
request's ``timeout_s``) and passes the answer on.

Why fork and not compile in the server itself: libtpu reads its flags, the dump
folder among them, once per process; and a process that has compiled only this
call holds in ``sys.modules`` exactly the project modules the compile imported,
and its audit hook saw exactly the data files it read, with no in-process cache
of an earlier compile hiding a read (:mod:`perfmodel.compiler.deps`). The
server imports jax and Pallas but never starts a backend (no libtpu, no XLA
client threads), so a fork is safe; a child pays libtpu's start (about 0.5 s)
instead of a new interpreter's jax import (about 2-3 s).

The server imports nothing of the project; the child imports what the compile
needs, and :mod:`perfmodel.compiler.deps` first.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from typing import Any, TextIO

#: Imported once by the server, shared copy-on-write with every child (no backend is started).
PRELOAD = ("numpy", "jax", "jax.numpy", "jax.experimental.topologies", "jax.experimental.pallas",
           "jax.experimental.pallas.tpu")
#: Bump when the request or answer layout changes.
PROTOCOL_VERSION = 1


def _child(request: dict[str, Any], work: str) -> None:
    """In the forked process: compile, record what was read, write the answer; never returns."""
    code = 0
    try:
        fd = os.open(os.path.join(work, "stderr.txt"), os.O_WRONLY | os.O_CREAT, 0o600)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        dump = request.get("dump_dir")  # the caller's folder, kept for it (benchmarks read the dumps)
        if not dump:
            dump = os.path.join(work, "dump")
            os.mkdir(dump)
        flags = [f for f in os.environ.get("LIBTPU_INIT_ARGS", "").split() if not f.startswith("--xla_jf_dump_to")]
        os.environ["LIBTPU_INIT_ARGS"] = " ".join([*flags, f"--xla_jf_dump_to={dump}"])
        from perfmodel.compiler.deps import ReadRecorder, make_record

        reads = ReadRecorder(exclude=[work, *request.get("exclude_reads", ())])
        sys.addaudithook(reads.audit)
        from perfmodel.compiler.worker import run_request

        answer = run_request({**request, "dump_dir": dump})
        answer["deps"] = make_record(sys.modules, reads)
        tmp = os.path.join(work, "answer.json.tmp")
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(answer, fh)
        os.replace(tmp, os.path.join(work, "answer.json"))
    except BaseException:  # noqa: BLE001 - the server reports a child without an answer as crashed
        import traceback

        traceback.print_exc()
        code = 3
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _last_line(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            lines = [ln.strip() for ln in fh.read().splitlines() if ln.strip()]
    except OSError:
        return "no output"
    return lines[-1][:300] if lines else "no output"


def serve_one(request: dict[str, Any]) -> dict[str, Any]:
    """Fork a child for one request and wait for its answer (or its crash, or the timeout)."""
    work = tempfile.mkdtemp(prefix="perfmodel-compile-")
    try:
        pid = os.fork()
        if pid == 0:
            _child(request, work)
        deadline = time.monotonic() + float(request.get("timeout_s", 600.0))
        status = None
        delay = 0.002
        while status is None:
            done, st = os.waitpid(pid, os.WNOHANG)
            if done:
                status = st
                break
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                return {"server_error": "timeout"}
            time.sleep(delay)
            delay = min(delay * 1.5, 0.05)
        answer_path = os.path.join(work, "answer.json")
        if os.path.isfile(answer_path):
            with open(answer_path, encoding="utf-8") as fh:
                return json.load(fh)
        code = os.waitstatus_to_exitcode(status)
        return {"server_error": "crashed", "returncode": code, "stderr": _last_line(os.path.join(work, "stderr.txt"))}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main(stdin: TextIO | None = None) -> int:
    out = os.fdopen(os.dup(1), "w", encoding="utf-8")  # the answers; stray writes to fd 1 go to stderr
    os.dup2(2, 1)
    for name in PRELOAD:
        importlib.import_module(name)
    out.write(json.dumps({"ready": True, "protocol": PROTOCOL_VERSION, "pid": os.getpid()}) + "\n")
    out.flush()
    for line in stdin or sys.stdin:
        if not line.strip():
            continue
        try:
            answer = serve_one(json.loads(line))
        except Exception as exc:  # noqa: BLE001 - a broken request must not end the server
            answer = {"server_error": "crashed", "returncode": None, "stderr": f"{type(exc).__name__}: {exc}"[:300]}
        out.write(json.dumps(answer) + "\n")
        out.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
