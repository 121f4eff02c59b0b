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


class _Seq:
    """One request inside the engine."""

    __slots__ = ("req", "send_s", "prompt", "target", "out", "computed", "private", "shared", "first_s", "last_s",
                 "chunks", "cached", "preemptions", "order", "published", "active", "tokens", "group", "decoding")

    def __init__(self, req: Request, send_s: float):
        self.req = req
        self.send_s = send_s
        self.prompt = req.input_tokens
        self.target = req.output_tokens
        self.out = 0  # output tokens emitted
        self.computed = 0  # tokens whose KV is in the cache
        self.private = 0  # blocks of its own
        self.shared: list = []  # cached prefix blocks it references
        self.first_s = -1.0
        self.last_s = -1.0
        self.chunks = 0
        self.cached = 0
        self.preemptions = 0
        self.order = 0
        self.published = 0  # leading prefix blocks already made cacheable
        self.active = False  # in the running list
        self.tokens = req.input_tokens  # prompt + emitted output
        self.group = req.prefix_group if req.prefix_tokens else None
        #: Past its (re)computed prompt: each step it decodes (or verifies drafts).
        self.decoding = False

    @property
    def blocks(self) -> int:
        return self.private + len(self.shared)


class VllmEngine:
    """One replica; :meth:`run` simulates a stream through it."""

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
        self.running: list[_Seq] = []
        self.waiting: deque[_Seq] = deque()
        self._order = 0
        #: Running requests still prefilling (not yet at their first token, or recomputing after preemption).
        self._prefilling = 0
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

    # ------------------------------------------------------------------ blocks

    def _free(self, s: _Seq) -> None:
        self.pool.give_back(s.private, s.shared)
        s.private, s.shared, s.published = 0, [], 0

    def _preempt(self, victim: _Seq) -> None:
        if not victim.decoding:
            self._prefilling -= 1
        victim.decoding = False
        self.running.remove(victim)
        victim.active = False
        self._free(victim)
        victim.computed = 0
        victim.preemptions += 1
        self.preemptions += 1
        self.waiting.appendleft(victim)

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

    # ------------------------------------------------------------------ scheduling

    def _schedule(self) -> list[tuple[_Seq, int, bool]]:
        """(request, tokens scheduled, is a decode / verification) of this step."""
        budget = self.cfg.max_num_batched_tokens
        out: list[tuple[_Seq, int, bool]] = []
        preempted = False
        ps, k, pool = self.ps, self.k, self.pool
        for s in list(self.running):
            if budget <= 0:
                break
            if not s.active:  # preempted while serving an earlier request
                continue
            decoding = s.decoding
            n = s.tokens - s.computed + (k if decoding else 0)
            if n > budget:
                n = budget
            while True:
                need = -(-(s.computed + n) // ps) - s.private - len(s.shared)
                if need <= 0 or pool.take(need):
                    if need > 0:
                        s.private += need
                    break
                victim = self.running[-1]
                self._preempt(victim)
                preempted = True
                if victim is s:
                    break
            if not s.active:
                continue
            out.append((s, n, decoding))
            budget -= n
        if preempted:
            return out
        while self.waiting and budget > 0 and len(self.running) < self.cfg.max_num_seqs:
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
            self._order += 1
            s.order = self._order
            self.running.append(s)
            self._prefilling += 1
            s.active = True
            out.append((s, n, False))
            budget -= n
        return out

    # ------------------------------------------------------------------ one step

    def _step(self, client: Client, batch: list[tuple[_Seq, int, bool]]) -> None:
        dec_ctx, chunks, verify = [], [], []
        tokens = dec_tokens = 0
        for s, n, decoding in batch:
            tokens += n
            dec_tokens += n if decoding else 0
            if decoding and n == 1:
                dec_ctx.append(s.computed + 1)
            elif decoding:
                verify.append((n, s.computed + n))
            else:
                chunks.append((n, s.computed + n))
        t_pad, b_pad = self.times.padded(tokens, len(batch))
        device = self.times.dense_s(t_pad, b_pad) + self.times.attention_s(np.asarray(dec_ctx, dtype=np.int64),
                                                                            chunks + verify)
        dt = device * self.cfg.device_factor(dec_tokens, tokens - dec_tokens) + self.cfg.host_s(len(batch))
        if self.draft is not None and verify:
            dt += self.draft.step_s(len(verify), [c for _, c in verify])
        self.now += dt
        self._account(dt, len(batch), tokens)
        emitting = 0
        finished = []
        now, gaps = self.now, self.rec.single_gaps
        for s, n, decoding in batch:
            s.computed += n
            if s.computed < s.tokens:  # a prefill chunk that is not the last
                if s.group is not None:
                    self._publish(s)
                continue
            if decoding and self.k:  # a verification: the pending token plus the accepted drafts
                accepted = int(np.count_nonzero(self.rng.random() < self._accept[:n - 1]))
                emit = min(1 + accepted, s.target - s.out)
            else:
                emit = 1
            if s.group is not None:
                self._publish(s)
            if not decoding:
                self._prefilling -= 1
                s.decoding = True
            # the client reads a chunk: the first token, or one more gap
            if s.out == 0 and s.first_s < 0:
                s.first_s = now
            else:
                gaps.append(now - s.last_s)
                s.chunks += 1
            s.out += emit
            s.tokens += emit
            s.last_s = now
            s.computed = s.tokens - 1  # the newest token's KV is written by the next step
            emitting += 1
            if s.out >= s.target:
                finished.append(s)
        self.rec.chunks(self.now, emitting)
        for s in finished:
            self._finish(s)
        if finished:
            client.finished(self.now, len(finished))

    def _finish(self, s: _Seq) -> None:
        self.running.remove(s)
        s.active = False
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
        self._tl.append((self.now, len(self.running), len(self.waiting), used))

    # ------------------------------------------------------------------ decode runs

    def _admissible(self, s: _Seq, budget: int) -> bool:
        """Whether the waiting request ``s`` could get its first chunk's blocks now (no run then: the blocks
        free only shrink while decodes run, so a request that cannot be admitted now cannot until one ends)."""
        hit = 0
        if s.computed == 0 and self.pool.prefix_caching and s.req.prefix_group is not None:
            cap = min(s.req.prefix_tokens // self.ps, (s.tokens - 1) // self.ps)
            while hit < cap and (s.req.prefix_group, hit) in self.pool.refs:
                hit += 1
        start = hit * self.ps
        n = s.tokens - start
        if not self.cfg.enable_chunked_prefill and n > budget:
            return False
        n = min(n, budget)
        return max(-(-(start + n) // self.ps) - hit, 0) <= self.pool.free_blocks

    def _preempt_for_decodes(self, need: np.ndarray, held: np.ndarray) -> bool:
        """The preemptions of a decode-only step whose blocks do not all fit, as vLLM makes them: running requests
        take blocks in order and each shortfall preempts the last running one, so the survivors are the longest
        prefix whose needs fit in the free blocks plus what the preempted suffix held. False (nothing done) when
        not even the first request would survive (the step-by-step path handles that)."""
        free = self.pool.free_blocks
        # prefix p survives iff sum(need[:p]) <= free + sum(held[p:])
        lhs = np.concatenate(([0], np.cumsum(need)))
        rhs = free + np.concatenate((np.cumsum(held[::-1])[::-1], [0]))
        p = int(np.flatnonzero(lhs <= rhs).max())
        if p == 0:
            return False
        for victim in reversed(self.running[p:]):
            self._preempt(victim)
        return True

    def _decode_run(self, client: Client) -> bool:
        """Run a block of pure-decode steps up to the next event; False when the state does not allow one."""
        if self.k or not self.running:
            return False
        if self._prefilling:
            return False
        nxt = client.next_send_s()
        B = len(self.running)
        can_admit = B < self.cfg.max_num_seqs and self.cfg.max_num_batched_tokens > B
        if self.waiting and can_admit and self._admissible(self.waiting[0], self.cfg.max_num_batched_tokens - B):
            return False
        rem = np.fromiter((s.target - s.out for s in self.running), dtype=np.int64, count=B)
        k = int(min(rem.min(), MAX_RUN_STEPS))
        if k < 2:
            return False
        ctx0 = np.fromiter((s.computed for s in self.running), dtype=np.int64, count=B)
        held = np.fromiter((s.blocks for s in self.running), dtype=np.int64, count=B)
        j = np.arange(k, dtype=np.int64)[:, None]
        ctx = ctx0[None, :] + 1 + j  # KV tokens after step j
        pages = -(-ctx // self.ps)
        new_blocks = np.maximum(pages - held[None, :], 0).sum(axis=1)  # cumulative: blocks held after step j
        ok = new_blocks <= self.pool.free_blocks
        if not ok[0]:
            return self._preempt_for_decodes(np.maximum(pages[0] - held, 0), held) and self._decode_run(client)
        if not ok.all():
            k = int(np.argmin(ok))
        pages = pages[:k]
        parts = self.times.decode_rows(pages).sum(axis=1)  # [steps, kernel, unit + 1]
        t_pad, b_pad = self.times.padded(B, B)
        dts = ((self.times.kernel_times(parts) + self.times.dense_s(t_pad, b_pad)) * self.cfg.device_factor(B, 0)
               + self.cfg.host_s(B))
        ends = self.now + np.cumsum(dts)
        if nxt is not None and can_admit:
            starts = ends - dts
            k_arr = int(np.searchsorted(starts, nxt, side="left"))  # steps starting before the arrival
            if k_arr < k:
                k = max(k_arr, 1)
                dts, ends = dts[:k], ends[:k]
        # first step: each request's own gap; later steps: the step time for all B
        self.rec.gaps(ends[0] - np.fromiter((s.last_s for s in self.running), dtype=float, count=B))
        if k > 1:
            self.rec.gaps(dts[1:], np.full(k - 1, B))
        for t in ends:
            self.rec.chunks(float(t), B)
        need_final = np.maximum(-(-(ctx0 + k) // self.ps) - held, 0)
        self.pool.take(int(need_final.sum()))
        end = float(ends[-1])
        for s, extra in zip(self.running, need_final):
            s.private += int(extra)
            s.out += k
            s.tokens += k
            s.computed += k
            s.chunks += k
            s.last_s = end
        self.now = end
        self.steps += k - 1  # _account adds one more
        self.sum_running += B * (k - 1)
        self.sum_tokens += B * (k - 1)
        self.sum_used += self.pool.used_blocks * (k - 1)
        self._account(float(dts.sum()), B, B)
        finished = [s for s in self.running if s.out >= s.target]
        for s in finished:
            self._finish(s)
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
            if not self.running and not self.waiting:
                nxt = client.next_send_s()
                if nxt is None:
                    break
                self.now = max(self.now, nxt)
                continue
            if self._decode_run(client):
                continue
            batch = self._schedule()
            if not batch:
                if not self.running:
                    raise InputError(f"request {self.waiting[0].req.index} cannot be scheduled: it needs more KV "
                                     f"blocks than the replica's {self.pool.num_blocks}; raise "
                                     "--gpu-memory-utilization or lower --max-model-len")
                continue
            self._step(client, batch)

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
