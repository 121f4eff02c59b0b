"""``--save-requests FILE.jsonl``: one JSON line per finished request, flushed and fsynced as it is written, so an
interrupted run leaves every finished record readable."""

from __future__ import annotations

import json
import os
from pathlib import Path

from perfmodel.errors import InputError
from perfmodel.serve.records import RequestRecord


def request_line(r: RequestRecord) -> dict:
    """One request as written: its times (ms from the benchmark start) and vLLM's per-request metrics."""
    return {"index": r.index, "replica": r.replica, "input_tokens": r.input_tokens, "output_tokens": r.output_tokens,
            "send_ms": r.send_s * 1e3, "ttft_ms": r.ttft_s * 1e3,
            "tpot_ms": None if r.tpot_s is None else r.tpot_s * 1e3, "e2el_ms": r.e2el_s * 1e3,
            "chunks": r.chunks, "cached_tokens": r.cached_tokens, "preemptions": r.preemptions}


class RequestWriter:
    def __init__(self, path: str, *, force: bool = False):
        p = Path(path)
        if p.exists() and not force:
            raise InputError(f"`save_requests`: {path} exists; pass --force to overwrite it or pick another name")
        if not p.parent.is_dir():
            raise InputError(f"`save_requests`: the directory of {path} does not exist; create it first")
        self._fh = open(p, "w", encoding="utf-8")

    def write(self, r: RequestRecord) -> None:
        self._fh.write(json.dumps(request_line(r)) + "\n")
        self._fh.flush()
        os.fsync(self._fh.fileno())

    def close(self) -> None:
        self._fh.close()
