"""JetStream's orchestrator over one replica (AI-Hypercomputer/JetStream@acd4f5ad, jetstream/core/orchestrator.py).

``max_num_seqs`` fixed decode slots. A request is prefilled alone, its whole prompt padded to the next prefill
bucket (perfmodel.serve.padding.jetstream_prefill_bucket), which yields its first token; its KV cache is then
inserted into a free slot. Each generate step runs every slot (the decode batch is always the slot count; empty
slots compute too) and gives one token to each occupied slot. The device runs one thing at a time: as the
orchestrator's generate thread does, each iteration inserts every prefilled request a free slot can take (a
prefill per free slot while requests wait), then runs one generate step. KV lives in the slots (each slot holds
``max_model_len`` tokens), so there is no preemption and no prefix cache.
"""

from __future__ import annotations

from collections import deque
from typing import Callable

import numpy as np

from perfmodel.serve.client import Client, Recorder
from perfmodel.serve.config import EngineConfig
from perfmodel.serve.padding import jetstream_prefill_bucket
from perfmodel.serve.records import EngineStats, RequestRecord, Timeline
from perfmodel.serve.steptime import StepTimes
from perfmodel.serve.workload import Request


class JetstreamEngine:
    def __init__(self, cfg: EngineConfig, times: StepTimes, *, replica: int = 0,
                 sink: Callable[[RequestRecord], None] | None = None):
        self.cfg = cfg
        self.times = times
        self.slots = cfg.max_num_seqs
        self.rec = Recorder(replica, sink)
        self.now = 0.0
        self.steps = 0
        self.sum_running = 0
        self.sum_tokens = 0
        self.busy = 0.0
        self._tl: list[tuple[float, int, int, int]] = []

    def run(self, requests: list[Request], max_concurrency: int | None) -> None:
        client = Client(requests, max_concurrency)
        waiting: deque[tuple[Request, float]] = deque()
        # per occupied slot: [request, send, first token time, last token time, ctx, out, chunks]
        active: list[list] = []
        while True:
            waiting.extend(client.send_until(self.now))
            if not active and not waiting:
                nxt = client.next_send_s()
                if nxt is None:
                    break
                self.now = max(self.now, nxt)
                continue
            while waiting and len(active) < self.slots:  # prefill and insert
                req, send = waiting.popleft()
                bucket = jetstream_prefill_bucket(req.input_tokens, self.cfg.jetstream_max_prefill_length)
                t_pad, b_pad = bucket, 1
                device = (self.times.dense_s(t_pad, b_pad) + self.times.attention_s(
                    np.zeros(0, dtype=np.int64), [(bucket, bucket)] if bucket > 1 else []))
                dt = device * self.cfg.device_factor(0, bucket) + self.cfg.host_s(1)
                self._advance(dt, 1, bucket, len(active), len(waiting))
                self.rec.chunks(self.now, 1)
                slot = [req, send, self.now, self.now, req.input_tokens, 1, 0]
                if req.output_tokens <= 1:
                    self._finish(slot, client)
                else:
                    active.append(slot)
                waiting.extend(client.send_until(self.now))
            if not active:
                continue
            ctx = np.asarray([s[4] + s[5] for s in active], dtype=np.int64)
            device = self.times.dense_s(self.slots, self.slots) + self.times.attention_s(ctx)
            dt = device * self.cfg.device_factor(self.slots, 0) + self.cfg.host_s(self.slots)
            self._advance(dt, len(active), self.slots, len(active), len(waiting))
            self.rec.chunks(self.now, len(active))
            done = []
            for s in active:
                self.rec.gap(self.now - s[3])
                s[3] = self.now
                s[5] += 1
                s[6] += 1
                if s[5] >= s[0].output_tokens:
                    done.append(s)
            for s in done:
                active.remove(s)
                self._finish(s, client)

    def _advance(self, dt: float, seqs: int, tokens: int, running: int, waiting: int) -> None:
        self.now += dt
        self.steps += 1
        self.sum_running += seqs
        self.sum_tokens += tokens
        self.busy += dt
        self._tl.append((self.now, running, waiting, running))

    def _finish(self, s: list, client: Client) -> None:
        req = s[0]
        self.rec.add(RequestRecord(
            index=req.index, send_s=s[1], first_token_s=s[2], finish_s=self.now, input_tokens=req.input_tokens,
            output_tokens=s[5], chunks=s[6], cached_tokens=0, preemptions=0, replica=self.rec.replica))
        client.finished(self.now)

    def stats(self) -> EngineStats:
        n = max(self.steps, 1)
        used = np.asarray([t[3] for t in self._tl] or [0], dtype=float) / self.slots
        return EngineStats(steps=self.steps, mean_running=self.sum_running / n, mean_step_tokens=self.sum_tokens / n,
                           mean_step_s=self.busy / n, preemptions=0, prefix_cache_queries=0, prefix_cache_hits=0,
                           kv_blocks=self.slots, block_size=self.cfg.max_model_len, peak_kv_usage=float(used.max()),
                           mean_kv_usage=float(used.mean()), busy_s=self.busy)

    def timeline(self) -> Timeline:
        arr = np.asarray(self._tl, dtype=float).reshape(-1, 4)
        return Timeline(t_s=arr[:, 0], running=arr[:, 1], waiting=arr[:, 2], kv_usage=arr[:, 3] / self.slots)
