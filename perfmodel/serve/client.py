"""The benchmark client's side of a simulated run: when each request is sent, and what it sees come back.

:class:`Client` holds the stream in send order. Without ``max_concurrency`` a request is sent at its arrival
time; with it, at the later of its arrival and the moment one of the ``max_concurrency`` slots frees (the end
of the step that finished a request), as ``vllm bench serve``'s semaphore does. :class:`Recorder` keeps each
request's token times as the client would read them from the stream: the first chunk gives the TTFT, every
later chunk one ITL gap, the last one the end-to-end latency.
"""

from __future__ import annotations

from collections import deque
from typing import Callable

import numpy as np

from perfmodel.serve.records import RequestRecord
from perfmodel.serve.workload import Request


class Client:
    def __init__(self, requests: tuple[Request, ...] | list[Request], max_concurrency: int | None):
        self._pending = deque(sorted(requests, key=lambda r: (r.arrival_s, r.index)))
        self.limit = max_concurrency
        self.in_flight = 0
        #: Times at which a slot freed and no request was waiting to take it.
        self._free_at: deque[float] = deque()

    @property
    def done(self) -> bool:
        return not self._pending

    def next_send_s(self) -> float | None:
        """When the next request will be sent, if no slot frees before then (None: none left, or every slot
        is taken)."""
        if not self._pending:
            return None
        if self.limit is not None and self.in_flight >= self.limit:
            return None
        return self._pending[0].arrival_s

    def send_until(self, now: float) -> list[tuple[Request, float]]:
        """Requests sent at or before ``now``, with their send times."""
        out = []
        while self._pending:
            if self.limit is not None and self.in_flight >= self.limit:
                break
            req = self._pending[0]
            if req.arrival_s > now:
                break
            self._pending.popleft()
            self.in_flight += 1
            send = max(req.arrival_s, self._free_at.popleft()) if self._free_at else req.arrival_s
            out.append((req, send))
        return out

    def finished(self, now: float, n: int = 1) -> None:
        """``n`` requests finished at ``now``: their slots free."""
        self.in_flight -= n
        if self.limit is not None:
            self._free_at.extend([now] * n)
            while len(self._free_at) > self.limit:
                self._free_at.popleft()


class Recorder:
    """Token times of every request. ITL gaps are kept as (value, count) pairs, so the equal gaps of one step
    (every request that also emitted in the step before) cost one entry."""

    def __init__(self, replica: int = 0, sink: "Callable[[RequestRecord], None] | None" = None):
        self.replica = replica
        self.sink = sink
        self.records: list[RequestRecord] = []
        #: Gap arrays, each value counted once (or by the matching array in _gap_counts).
        self._gap_values: list[np.ndarray] = []
        self._gap_counts: list[np.ndarray | int] = []
        #: Single (value, count) gaps, appended as Python numbers: cheaper than an array each.
        self._one_values: list[float] = []
        self._one_counts: list[int] = []
        #: Step ends and the chunks (requests emitting tokens) in each: the peak-throughput buckets.
        self.chunk_times: list[float] = []
        self.chunk_counts: list[int] = []

    def add(self, record: RequestRecord) -> None:
        """A finished request (handed to ``sink`` at once: the --save-requests writer)."""
        self.records.append(record)
        if self.sink is not None:
            self.sink(record)

    def gap(self, value: float, count: int = 1) -> None:
        """``count`` gaps of ``value`` seconds."""
        self._one_values.append(value)
        self._one_counts.append(count)

    def gaps(self, values: np.ndarray, counts: np.ndarray | int = 1) -> None:
        """Gaps of ``values`` seconds, each ``counts`` times (per value, or one count for all)."""
        self._gap_values.append(values)
        self._gap_counts.append(counts)

    def step_gaps(self, now: float, last: np.ndarray, prev_end: float) -> None:
        """The gaps that requests whose previous chunks came at ``last`` see at a step ending ``now``: one entry
        for those whose previous chunk came at ``prev_end`` (the step before), one each for the rest."""
        same = last == prev_end
        n_same = int(np.count_nonzero(same))
        if n_same:
            self.gap(now - prev_end, n_same)
        if n_same < len(last):
            self.gaps(now - last[~same])

    def chunks(self, t: float, n: int) -> None:
        if n:
            self.chunk_times.append(t)
            self.chunk_counts.append(n)

    def chunks_at(self, times: np.ndarray, n: int) -> None:
        """``n`` chunks at each of ``times``."""
        self.chunk_times.extend(times.tolist())
        self.chunk_counts.extend([n] * len(times))

    def itl(self) -> tuple[np.ndarray, np.ndarray]:
        """(gap values in seconds, how many gaps have each value)."""
        values = np.concatenate(self._gap_values + [np.asarray(self._one_values, dtype=float)])
        counts = np.concatenate([np.full(len(v), c, dtype=np.int64) if isinstance(c, int)
                                 else np.asarray(c, dtype=np.int64) for v, c in zip(self._gap_values, self._gap_counts)]
                                + [np.asarray(self._one_counts, dtype=np.int64)])
        return values, counts

    def itl_s(self) -> np.ndarray:
        """Every gap (the values repeated by their counts)."""
        return np.repeat(*self.itl())
