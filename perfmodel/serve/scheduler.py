"""vLLM v1's scheduler over one replica, as tpu-inference runs it, driven step by step against simulated time.

Each engine step (vllm/v1/core/sched/scheduler.py; vllm-project/vllm@b4622cf9):

1. requests the client has sent by the step's start join the waiting queue;
2. **running requests first**, in admission order, under the token budget (``max_num_batched_tokens``): a
   decode takes 1 token (1 + k with k speculative tokens), a chunked prefill the rest of its prompt up to the
   budget. Each needs KV blocks for its tokens (plus k lookahead with speculation); when the pool is short, the
   **last** running request is preempted (blocks freed, progress dropped: recomputed later from the start, its
   generated tokens included) and put at the front of the waiting queue, until the allocation fits or the
   request itself was preempted;
3. unless something was preempted, **waiting requests** in order while the budget lasts and fewer than
   ``max_num_seqs`` run: a prefix-cache hit (perfmodel.serve.kvblocks) skips the cached prompt blocks, the rest
   is scheduled (cut at the budget with chunked prefill; without it a prompt that does not fit waits for the next
   step); a request that cannot get its blocks stops admission for this step;
4. the step runs as one ragged forward pass (perfmodel.serve.steptime: padded to tpu-inference's precompiled
   shapes, plus the host's per-step time); at its end every request whose prompt is now fully computed emits
   one token (its first, or the next), a speculative verification 1 + the accepted drafts (drawn from the
   acceptance model), and finished requests free their blocks and their client slot.

Long stretches of pure decoding (nothing waiting that could be admitted, no prefill in flight) are run in one
vectorized block of steps up to the next event (a request finishing, a request arriving that could be admitted,
the KV pool running short), with the same step times as one step at a time.
"""

from __future__ import annotations

from collections import deque
from typing import Callable

import numpy as np

from perfmodel.errors import InputError
from perfmodel.serve.client import Client, Recorder
from perfmodel.serve.config import EngineConfig
from perfmodel.serve.kvblocks import BlockPool
from perfmodel.serve.records import EngineStats, RequestRecord, Timeline
from perfmodel.serve.steptime import StepTimes
from perfmodel.serve.workload import Request

#: Longest block of decode steps run at once (bounds the [steps, sequences] arrays).
MAX_RUN_STEPS = 2048


def _unscaled(decode_tokens: int, prefill_tokens: int) -> float:
    return 1.0


class _Seq:
    """One request inside the engine. While it decodes, its running state lives in the engine's arrays
    (:class:`_Decodes`); the object holds it again when it leaves them."""

    __slots__ = ("req", "send_s", "prompt", "target", "out", "computed", "private", "shared", "first_s", "last_s",
                 "chunks", "cached", "preemptions", "published", "tokens", "group", "slot")

    def __init__(self, req: Request, send_s: float):
        self.req = req
        self.send_s = send_s
        self.prompt = req.input_tokens
        self.target = req.output_tokens
        self.out = 0  # output tokens emitted
        self.tokens = req.input_tokens  # prompt + emitted output
        self.computed = 0  # tokens whose KV is in the cache
        self.private = 0  # blocks of its own
        self.shared: list = []  # cached prefix blocks it references
        self.first_s = -1.0
        self.last_s = -1.0
        self.chunks = 0
        self.cached = 0
        self.preemptions = 0
        self.published = 0  # leading prefix blocks already made cacheable
        self.group = req.prefix_group if req.prefix_tokens else None
        self.slot = -1  # its row in the decode arrays while it decodes

    @property
    def blocks(self) -> int:
        return self.private + len(self.shared)


class _Decodes:
    """The running requests past their (re)computed prompt, one row each in running order (a request enters
    decoding after every row already there: it was admitted after them), as arrays: the first ``count`` rows
    are live, so a step's decodes (always a leading run of them: the budget and preemption cut from the end)
    are slices, not gathers."""

    def __init__(self, capacity: int):
        self.seq: list[_Seq] = []
        self.ctx = np.zeros(capacity, dtype=np.int64)  # tokens in the KV cache
        self.out = np.zeros(capacity, dtype=np.int64)
        self.tokens = np.zeros(capacity, dtype=np.int64)
        self.target = np.zeros(capacity, dtype=np.int64)
        self.held = np.zeros(capacity, dtype=np.int64)  # blocks (private + shared)
        self.last = np.zeros(capacity)  # last chunk's time
        self.chunks = np.zeros(capacity, dtype=np.int64)
        self._arrays = (self.ctx, self.out, self.tokens, self.target, self.held, self.last, self.chunks)
        self.count = 0  # live rows: len(self.seq)

    def enter(self, s: _Seq) -> None:
        i = self.count
        self.seq.append(s)
        self.count += 1
        self.ctx[i], self.out[i], self.tokens[i], self.target[i] = s.computed, s.out, s.tokens, s.target
        self.held[i], self.last[i], self.chunks[i] = s.blocks, s.last_s, s.chunks

    def _hand_back(self, i: int) -> _Seq:
        """Row i's state back into its request."""
        s = self.seq[i]
        s.computed, s.out, s.tokens = int(self.ctx[i]), int(self.out[i]), int(self.tokens[i])
        s.private = int(self.held[i]) - len(s.shared)
        s.last_s, s.chunks = float(self.last[i]), int(self.chunks[i])
        return s

    def leave(self, rows: np.ndarray) -> list[_Seq]:
        """Take the rows ``rows`` (ascending) out, their state handed back; the rest keep their order."""
        if not len(rows):
            return []
        out = [self._hand_back(int(i)) for i in rows]
        n = len(self.seq)
        if len(rows) <= 4:  # a few: shift the rows after each up (cheaper than a mask)
            for i in reversed(rows.tolist()):
                for arr in self._arrays:
                    arr[i:n - 1] = arr[i + 1:n]
                del self.seq[i]
                n -= 1
            self.count = n
            return out
        keep = np.ones(n, dtype=bool)
        keep[rows] = False
        m = n - len(rows)
        for arr in self._arrays:
            arr[:m] = arr[:n][keep]
        self.seq = [s for s, k in zip(self.seq, keep.tolist()) if k]
        self.count = m
        return out

    def leave_span(self, p: int, end: int) -> list[_Seq]:
        """Take rows ``p`` to ``end`` - 1 out, last first (the order preemption takes them); the rows after them
        move up."""
        out = [self._hand_back(i) for i in range(end - 1, p - 1, -1)]
        n = len(self.seq)
        for arr in self._arrays:
            arr[p:n - end + p] = arr[end:n]
        del self.seq[p:end]
        self.count = len(self.seq)
        return out


class VllmEngine:
    """One replica; :meth:`run` simulates a stream through it. Running requests are the decoding rows
    (:class:`_Decodes`, admitted first) followed by the requests still prefilling (``self.pre``, a list in
    admission order): a prefill is admitted only while budget is left after every running request, so a request
    still prefilling is never followed by one that decodes."""

    def __init__(self, cfg: EngineConfig, times: StepTimes, num_blocks: int, *, seed: int = 0, replica: int = 0,
                 draft: "DraftCost | None" = None, sink: Callable[[RequestRecord], None] | None = None):
        self.cfg = cfg
        self.times = times
        self.pool = BlockPool(num_blocks, cfg.block_size, prefix_caching=cfg.enable_prefix_caching)
        self.ps = cfg.block_size
        self.spec = cfg.speculative
        self.k = self.spec.num_speculative_tokens if self.spec else 0
        self._accept = np.asarray(self.spec.acceptance) if self.spec else np.zeros(0)
        self.rng = np.random.default_rng(seed + 7919 * replica)
        self.draft = draft
        self.rec = Recorder(replica, sink)
        self.dec = _Decodes(cfg.max_num_seqs + 1)
        #: Tokens each decode pushes when the budget does not cut (read-only: sliced per step).
        self._per_decode = np.full(cfg.max_num_seqs + 1, 1 + self.k, dtype=np.int64)
        self._steps = np.arange(MAX_RUN_STEPS, dtype=np.int64)[:, None]  # step j of a decode run
        self._device_factor = cfg.device_factor if cfg.compiled is not None else _unscaled
        self.pre: list[_Seq] = []
        self.waiting: deque[_Seq] = deque()
        self.now = 0.0
        # statistics
        self.steps = 0
        self.sum_running = 0
        self.sum_tokens = 0
        self.busy = 0.0
        self.preemptions = 0
        self.peak_used = 0
        self.sum_used = 0
        self._tl: list[tuple[float, int, int, int]] = []

    @property
    def n_running(self) -> int:
        return self.dec.count + len(self.pre)

    # ------------------------------------------------------------------ blocks and preemption

    def _free(self, s: _Seq) -> None:
        self.pool.give_back(s.private, s.shared)
        s.private, s.shared, s.published = 0, [], 0

    def _to_waiting(self, s: _Seq) -> None:
        """Preemption by recompute: blocks freed, progress dropped, front of the waiting queue."""
        self._free(s)
        s.computed = 0
        s.preemptions += 1
        self.preemptions += 1
        self.waiting.appendleft(s)

    def _preempt_last(self) -> _Seq:
        """Preempt the last running request (the last prefill, else the last decode)."""
        if self.pre:
            victim = self.pre.pop()
        else:
            victim = self.dec.leave_span(self.dec.count - 1, self.dec.count)[0]
        self._to_waiting(victim)
        return victim

    def _publish(self, s: _Seq) -> None:
        """Make the full blocks of the request's group prefix it has computed cacheable."""
        if s.group is None or not self.pool.prefix_caching:
            return
        full = min(s.req.prefix_tokens, s.computed) // self.ps
        while s.published < full:
            key = (s.req.prefix_group, s.published)
            if s.published >= len(s.shared) and self.pool.publish(key):
                s.private -= 1
                s.shared.append(key)
            s.published += 1

    def _fit_decodes(self, need: np.ndarray) -> tuple[int, bool]:
        """Give the leading decode rows their ``need`` new blocks (:meth:`_make_room` first). Returns how many
        rows survive and whether anything was preempted."""
        total = int(need.sum())
        if not total:  # the common case: no row crosses into a new block this step
            return len(need), False
        m, preempted = self._make_room(need, total)
        if m < len(need):
            need = need[:m]
            total = int(need.sum())
        self.pool.take(total)
        self.dec.held[:m] += need
        return m, preempted

    def _make_room(self, need: np.ndarray, total: int) -> tuple[int, bool]:
        """The preemptions that let the leading ``len(need)`` decode rows take ``need`` (``total``) new blocks, as
        vLLM makes them: on a shortfall the last running request is preempted, first the prefills after them,
        then decodes from the end, so the survivors are the longest prefix whose needs fit in the free blocks
        plus what the preempted suffix held. Returns how many rows survive and whether anything was preempted."""
        preempted = False
        m = len(need)
        while total > self.pool.free_blocks and self.pre:
            self._to_waiting(self.pre.pop())
            preempted = True
        if total > self.pool.free_blocks:
            held = self.dec.held[:m]
            lhs = np.concatenate(([0], np.cumsum(need)))
            rhs = self.pool.free_blocks + np.concatenate((np.cumsum(held[::-1])[::-1], [0]))
            p = int(np.flatnonzero(lhs <= rhs).max())
            for s in self.dec.leave_span(p, m):
                self._to_waiting(s)
            m, preempted = p, True
        return m, preempted

    # ------------------------------------------------------------------ scheduling

    def _schedule(self) -> tuple[np.ndarray, list[tuple[_Seq, int]]]:
        """(tokens of each of the leading decode rows scheduled, [(prefilling request, tokens)]) of this step
        (module docstring)."""
        budget = self.cfg.max_num_batched_tokens
        d = self.dec
        n = self._per_decode[:d.count]
        if (1 + self.k) * d.count > budget:  # the budget ends within the decodes
            start = np.cumsum(n) - n  # budget used before each decode
            n = np.clip(budget - start, 0, n)
            n = n[n > 0]
        m = len(n)
        need = np.maximum((d.ctx[:m] + n - 1) // self.ps + 1 - d.held[:m], 0)  # ceil((ctx + n) / page) - held
        m, preempted = self._fit_decodes(need)
        n = n[:m]
        budget -= m if not self.k else int(n.sum())
        pre: list[tuple[_Seq, int]] = []
        for s in list(self.pre):
            if budget <= 0:
                break
            if s not in self.pre:  # preempted while serving an earlier prefill
                continue
            m = min(s.tokens - s.computed, budget)
            while True:
                need1 = -(-(s.computed + m) // self.ps) - s.private - len(s.shared)
                if need1 <= 0 or self.pool.take(need1):
                    if need1 > 0:
                        s.private += need1
                    break
                victim = self._preempt_last()
                preempted = True
                if victim is s:
                    break
            if s not in self.pre:
                continue
            pre.append((s, m))
            budget -= m
        if not preempted:
            self._admit(budget, pre)
        return n, pre

    def _admit(self, budget: int, pre: list[tuple[_Seq, int]]) -> None:
        """Waiting requests in order while the budget lasts and fewer than max-num-seqs run."""
        room = self.cfg.max_num_seqs - self.n_running  # requests that may still join
        while self.waiting and budget > 0 and room > 0:
            s = self.waiting[0]
            hit: list = []
            if s.computed == 0:
                hit = self.pool.lookup(s.req.prefix_group, s.req.prefix_tokens // self.ps, s.tokens)
                self.pool.touch(hit)
            start = len(hit) * self.ps
            n = s.tokens - start
            if not self.cfg.enable_chunked_prefill and n > budget:
                self.pool.untouch(hit)
                break
            n = min(n, budget)
            need = max(-(-(start + n) // self.ps) - len(hit), 0)
            if not self.pool.take(need):
                self.pool.untouch(hit)
                break
            self.waiting.popleft()
            self.pool.admitted(s.tokens, hit)
            s.shared, s.private, s.computed = list(hit), need, start
            s.published = len(hit)
            s.cached += start
            self.pre.append(s)
            pre.append((s, n))
            budget -= n
            room -= 1

    # ------------------------------------------------------------------ one step

    def _step(self, client: Client, n: np.ndarray, pre: list[tuple[_Seq, int]]) -> None:
        d, t = self.dec, self.times
        m = len(n)  # the leading decode rows in this step
        dec_tokens = int(n.sum()) if self.k else m
        tokens = dec_tokens + sum(q for _, q in pre)
        seqs = m + len(pre)
        if self.k:
            ctx_after = d.ctx[:m] + n
            parts = 0.0
            for q in np.unique(n):
                sel = n == q
                parts = parts + (t.decode_sums(((ctx_after[sel] - 1) // self.ps)[None, :])[0] if q == 1
                                 else t.chunk_rows(int(q), ctx_after[sel]).sum(axis=0))
        else:  # each decode over ctx + 1 tokens: row ceil((ctx + 1) / page) - 1
            parts = t.decode_sums((d.ctx[:m] // self.ps)[None, :])[0]
        if pre:
            parts = parts + t.chunk_parts([(q, s.computed + q) for s, q in pre])
        t_pad, b_pad = t.padded(tokens, seqs)
        dt = ((t.dense_s(t_pad, b_pad) + t.kernel_time(parts)) * self._device_factor(dec_tokens, tokens - dec_tokens)
              + self.cfg.host_s(seqs))
        if self.draft is not None and self.k and m:
            dt += self.draft.step_s(m, ctx_after.tolist())
        prev_end = self.now
        self.now += dt
        now = self.now
        self._account(dt, seqs, tokens)
        # decodes: one chunk each (a verification: the pending token plus the accepted drafts)
        if m:
            if self.k:
                u = self.rng.random(m)
                allowed = np.arange(self.k)[None, :] < (n - 1)[:, None]
                accepted = ((u[:, None] < self._accept[None, :]) & allowed).sum(axis=1)
                emit = np.minimum(1 + accepted, d.target[:m] - d.out[:m])
            else:
                emit = 1
            self.rec.step_gaps(now, d.last[:m], prev_end)
            d.out[:m] += emit
            d.tokens[:m] += emit
            np.subtract(d.tokens[:m], 1, out=d.ctx[:m])  # the newest token's KV is written by the next step
            d.last[:m] = now
            d.chunks[:m] += 1
            finished = d.leave((d.out[:m] >= d.target[:m]).nonzero()[0])
        else:
            finished = []
        emitting = m
        for s, m in pre:
            s.computed += m
            self._publish(s)
            if s.computed < s.tokens:  # a prefill chunk that is not the last
                continue
            # the client reads a chunk: the first token, or one more gap (a request recomputed after preemption)
            if s.first_s < 0:
                s.first_s = now
            else:
                self.rec.gap(now - s.last_s)
                s.chunks += 1
            s.out += 1
            s.tokens += 1
            s.last_s = now
            s.computed = s.tokens - 1
            emitting += 1
            self.pre.remove(s)
            if s.out >= s.target:
                finished.append(s)
            else:
                d.enter(s)
        self.rec.chunks(now, emitting)
        for s in finished:
            self._record(s)
        if finished:
            client.finished(now, len(finished))

    def _record(self, s: _Seq) -> None:
        """A finished request: its blocks freed, its record written."""
        self._free(s)
        self.rec.add(RequestRecord(
            index=s.req.index, send_s=s.send_s, first_token_s=s.first_s, finish_s=self.now,
            input_tokens=s.prompt, output_tokens=s.out, chunks=s.chunks, cached_tokens=s.cached,
            preemptions=s.preemptions, replica=self.rec.replica))

    def _account(self, dt: float, seqs: int, tokens: int, steps: int = 1) -> None:
        self.steps += steps
        self.sum_running += seqs * steps
        self.sum_tokens += tokens * steps
        self.busy += dt
        used = self.pool.used_blocks
        self.peak_used = max(self.peak_used, used)
        self.sum_used += used * steps
        self._tl.append((self.now, self.n_running, len(self.waiting), used))

    # ------------------------------------------------------------------ decode runs

    def _admissible(self, s: _Seq, budget: int) -> bool:
        """Whether the waiting request ``s`` could get its first chunk's blocks now (no run then: the blocks
        free only shrink while decodes run, so a request that cannot be admitted now cannot until one ends)."""
        hit = len(self.pool.lookup(s.req.prefix_group, s.req.prefix_tokens // self.ps, s.tokens)) if (
            s.computed == 0) else 0
        start = hit * self.ps
        n = s.tokens - start
        if not self.cfg.enable_chunked_prefill and n > budget:
            return False
        n = min(n, budget)
        return max(-(-(start + n) // self.ps) - hit, 0) <= self.pool.free_blocks

    def _decode_run(self, client: Client) -> bool:
        """Run a block of pure-decode steps up to the next event; False when the state does not allow one."""
        d = self.dec
        if self.k or self.pre or not d.count:
            return False
        nxt = client.next_send_s()
        B = d.count
        can_admit = B < self.cfg.max_num_seqs and self.cfg.max_num_batched_tokens > B
        if self.waiting and can_admit and self._admissible(self.waiting[0], self.cfg.max_num_batched_tokens - B):
            return False
        k = int(min((d.target[:B] - d.out[:B]).min(), MAX_RUN_STEPS))
        if k < 2:
            return False
        ctx0, held = d.ctx[:B], d.held[:B]
        row = (ctx0 + self._steps[:k]) // self.ps  # [k, B]: step j's decode table row (pages - 1)
        new_blocks = np.maximum(row + 1 - held, 0).sum(axis=1)  # cumulative: blocks taken by the end of step j
        ok = new_blocks <= self.pool.free_blocks
        if not ok[0]:
            need0 = np.maximum(row[0] + 1 - held, 0)
            kept, _ = self._make_room(need0, int(need0.sum()))
            return bool(kept) and self._decode_run(client)
        if not ok.all():
            k = int(np.argmin(ok))
            row = row[:k]
        parts = self.times.decode_sums(row)  # [k, kernel, unit + 1]
        t_pad, b_pad = self.times.padded(B, B)
        dts = ((self.times.kernel_times(parts) + self.times.dense_s(t_pad, b_pad)) * self._device_factor(B, 0)
               + self.cfg.host_s(B))
        ends = self.now + np.cumsum(dts)
        if nxt is not None and can_admit:
            starts = ends - dts
            k_arr = int(np.searchsorted(starts, nxt, side="left"))  # steps starting before the arrival
            if k_arr < k:
                k = max(k_arr, 1)
                dts, ends = dts[:k], ends[:k]
        # first step: each request's own gap; later steps: the step time for all B
        self.rec.step_gaps(float(ends[0]), d.last[:B], self.now)
        if k > 1:
            self.rec.gaps(dts[1:], B)
        self.rec.chunks_at(ends, B)
        need_final = np.maximum(row[k - 1] + 1 - held, 0)
        self.pool.take(int(new_blocks[k - 1]))
        end = float(ends[-1])
        d.held[:B] += need_final
        d.out[:B] += k
        d.tokens[:B] += k
        d.ctx[:B] += k
        d.chunks[:B] += k
        d.last[:B] = end
        self.now = end
        self.steps += k - 1  # _account adds one more
        self.sum_running += B * (k - 1)
        self.sum_tokens += B * (k - 1)
        self.sum_used += self.pool.used_blocks * (k - 1)
        self._account(float(dts.sum()), B, B)
        finished = d.leave((d.out[:B] >= d.target[:B]).nonzero()[0])
        for s in finished:
            self._record(s)
        if finished:
            client.finished(self.now, len(finished))
        return True

    # ------------------------------------------------------------------ the run

    def run(self, requests: list[Request], max_concurrency: int | None) -> None:
        client = Client(requests, max_concurrency)
        longest = self.cfg.max_model_len
        while True:
            for req, send in client.send_until(self.now):
                if req.input_tokens + req.output_tokens > longest:
                    raise InputError(f"request {req.index}: {req.input_tokens} prompt + {req.output_tokens} output "
                                     f"tokens exceed `max_model_len` {longest}; raise --max-model-len or shorten "
                                     "the requests")
                self.waiting.append(_Seq(req, send))
            if not self.n_running and not self.waiting:
                nxt = client.next_send_s()
                if nxt is None:
                    break
                self.now = max(self.now, nxt)
                continue
            if self._decode_run(client):
                continue
            n, pre = self._schedule()
            if not len(n) and not pre:
                if not self.n_running:
                    raise InputError(f"request {self.waiting[0].req.index} cannot be scheduled: it needs more KV "
                                     f"blocks than the replica's {self.pool.num_blocks}; raise "
                                     "--gpu-memory-utilization or lower --max-model-len")
                continue
            self._step(client, n, pre)

    def stats(self) -> EngineStats:
        n = max(self.steps, 1)
        return EngineStats(steps=self.steps, mean_running=self.sum_running / n, mean_step_tokens=self.sum_tokens / n,
                           mean_step_s=self.busy / n, preemptions=self.preemptions,
                           prefix_cache_queries=self.pool.query_tokens, prefix_cache_hits=self.pool.hit_tokens,
                           kv_blocks=self.pool.num_blocks, block_size=self.ps,
                           peak_kv_usage=self.peak_used / self.pool.num_blocks,
                           mean_kv_usage=self.sum_used / n / self.pool.num_blocks, busy_s=self.busy)

    def timeline(self) -> Timeline:
        arr = np.asarray(self._tl, dtype=float).reshape(-1, 4)
        return Timeline(t_s=arr[:, 0], running=arr[:, 1], waiting=arr[:, 2],
                        kv_usage=arr[:, 3] / self.pool.num_blocks)


class DraftCost:
    """Seconds a speculative proposer spends per step: nothing on the device for ngram (a host-side lookup);
    k passes of one decoder layer plus the LM head of the target's shape for eagle / eagle3 / mtp (one-layer
    draft heads); k decode steps of the draft model for draft_model."""

    def __init__(self, cfg: EngineConfig, times: StepTimes, draft_times: StepTimes | None = None):
        self.k = cfg.speculative.num_speculative_tokens
        self.method = cfg.speculative.method
        self.times = times
        self.draft_times = draft_times

    def step_s(self, seqs: int, ctx: list[int]) -> float:
        if self.method == "ngram":
            return 0.0
        if self.method == "draft_model":
            t = self.draft_times
            t_pad, b_pad = t.padded(seqs, seqs)
            return self.k * (t.dense_s(t_pad, b_pad) + t.attention_s(np.asarray(ctx, dtype=np.int64)))
        t_pad, b_pad = self.times.padded(seqs, seqs)
        layer, head = self.times.layer_and_head_s(t_pad, b_pad)
        att = self.times.attention_s(np.asarray(ctx, dtype=np.int64)) / self.times.model.num_layers
        return self.k * (layer + head + att)
