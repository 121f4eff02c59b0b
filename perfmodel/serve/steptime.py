"""Time of one engine step from perfmodel's transformer model, fast enough to price every step of a long run.

A step of a vLLM TPU server is one ragged forward pass (perfmodel.model.step.mixed_step): sequence i pushes
``q_i`` new tokens over ``c_i`` KV tokens. Its time splits in two:

* the **dense part**: every op but attention (projections, MLP / MoE, norms, RoPE, KV write, collectives, the
  LM head and the sampler): it depends only on the step's padded token count T and padded request count B
  (perfmodel.serve.padding), so it is evaluated once per (T, B) from the step model and cached;
* the **attention part** (``transformer.context_op_names``): one kernel per layer kind over all sequences. The op
  model's work adds over sequences, so each sequence's achievable per-unit seconds come from a table
  (``core.additive_times``: one vectorized op-model call per table row) and the step's attention time is, per
  kernel, ``max over units of the summed seconds + the summed serial seconds + one launch`` -- the same number
  the op model gives for the whole ragged batch, up to the flat q-block boundaries the per-sequence pricing
  ignores. Decode rows (``q = 1``) are tabulated per whole page of context; prefill chunks and speculative
  verifications (``q > 1``) on a grid of query lengths (every length up to 16, then 4 points per octave) and of
  prior context (every 256 tokens), bilinear between grid points.

On top: ``host_overhead_s`` per step (perfmodel.serve.calibration), the speculative proposer's time, and
``--op-speedup NAME=X`` (an op's time divided by X; ``attention`` names every attention kernel).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from perfmodel.errors import InputError
from perfmodel.serve.config import EngineConfig
from perfmodel.serve.padding import Padding

#: Prior-context grid step of the q > 1 tables, tokens.
PREFIX_GRID_TOKENS = 256
#: Largest [steps, pages] histogram :meth:`StepTimes.decode_sums` builds.
HISTOGRAM_CELLS = 1 << 16
#: Query lengths priced exactly up to this; above it, 4 grid points per octave.
EXACT_QUERY_LEN = 16


def query_grid(max_q: int) -> np.ndarray:
    """Query lengths of the q > 1 tables: 2..16, then 4 points per octave up to ``max_q`` (and ``max_q``)."""
    pts = list(range(2, min(EXACT_QUERY_LEN, max_q) + 1))
    base = EXACT_QUERY_LEN
    while base < max_q:
        pts += [min(base + base * j // 4, max_q) for j in range(1, 5)]
        base *= 2
    return np.unique(np.asarray(pts + [max(max_q, 2)], dtype=np.int64))


def matches(key: str, op_name: str) -> bool:
    """Whether ``--op-speedup key=...`` applies to the op ``op_name`` (its name, or ``attention`` for every
    attention kernel: ``attention(global)``, ``attention(window N)``)."""
    return op_name == key or op_name.startswith(key + "(")


@dataclass(frozen=True, kw_only=True)
class _Kernel:
    """One attention kernel of the step (a layer kind), ``layers`` times per step."""

    name: str
    layers: int
    speedup: float


class StepTimes:
    """Step times of one replica (:meth:`step_s`), from cached dense times and attention tables."""

    def __init__(self, cfg: EngineConfig, *, model: Any = None, tp: int | None = None):
        from perfmodel.model.step import mixed_step
        from perfmodel.model.transformer import context_op_names

        self.cfg = cfg
        self.model = model or cfg.model
        self.tp = tp or cfg.tp
        self.padding = Padding(enabled=cfg.padding, max_num_batched_tokens=cfg.max_num_batched_tokens,
                               max_num_seqs=cfg.max_num_seqs)
        self.page = cfg.block_size
        self._template = mixed_step(query_lens=[1], context_lens=[1], weight_dtype=cfg.weight_dtype,
                                    act_dtype=cfg.act_dtype, kv_dtype=cfg.kv_cache_dtype, tp=self.tp,
                                    page_size=cfg.block_size)
        self._context_ops = context_op_names(self.model)
        self._dense: dict[tuple[int, int], float] = {}
        self._padded: dict[tuple[int, int], tuple[int, int]] = {}
        self._layer: dict[int, tuple[float, float]] = {}
        self._speedups = dict(cfg.op_speedups)
        self._check_speedups()
        self._kernels: list[_Kernel] | None = None
        self._dec = np.zeros((0, 0, 0))  # [pages, kernel, unit + 1 (own seconds)]
        self._launch = None  # [kernel] launch + DMA seconds
        self._qrows: dict[int, np.ndarray] = {}  # grid q -> [prefix grid, kernel, unit + 1]
        self._chunks: dict[tuple[int, int], np.ndarray] = {}  # (q, c) -> [kernel, unit + 1], as priced
        self._qweights: dict[int, list[tuple[np.ndarray, float]]] = {}  # q -> [(grid row, weight)]
        self._qgrid = query_grid(max(cfg.max_num_batched_tokens, 2))
        self._prefix_points = int(math.ceil(cfg.max_model_len / PREFIX_GRID_TOKENS)) + 1
        lookahead = cfg.speculative.num_speculative_tokens if cfg.speculative else 0
        self._max_pages = -(-(cfg.max_model_len + lookahead + 1) // cfg.block_size)

    # ------------------------------------------------------------------ speedups

    def op_names(self) -> list[str]:
        """Names of the step's ops (what --op-speedup accepts)."""
        from perfmodel.model.step import mixed_step
        from perfmodel.model.transformer import step_ops

        step = mixed_step(query_lens=[2, 1], context_lens=[2, 1], weight_dtype=self.cfg.weight_dtype,
                          act_dtype=self.cfg.act_dtype, kv_dtype=self.cfg.kv_cache_dtype, tp=self.tp,
                          page_size=self.page)
        return list(dict.fromkeys(op.name for op in step_ops(self.model, step, self.cfg.chip)))

    def _check_speedups(self) -> None:
        if not self._speedups:
            return
        names = self.op_names()
        for key in self._speedups:
            if not any(matches(key, n) for n in names):
                raise InputError(f"`op_speedup` '{key}': {self.model.name}'s step has no such op; ops: "
                                 f"{', '.join(names)}")

    def _factor(self, op_name: str) -> float:
        f = 1.0
        for key, x in self._speedups.items():
            if matches(key, op_name):
                f *= x
        return f

    # ------------------------------------------------------------------ dense part

    def dense_s(self, tokens: int, seqs: int) -> float:
        """Seconds of every non-attention op for a step of ``tokens`` tokens over ``seqs`` sequences (padded)."""
        key = (tokens, seqs)
        hit = self._dense.get(key)
        if hit is None:
            hit = self._dense[key] = self._dense_eval(tokens, seqs)[0]
        return hit

    def _dense_eval(self, tokens: int, seqs: int) -> tuple[float, float, float]:
        """(dense seconds, one layer's dense seconds, the head's seconds) at (tokens, seqs)."""
        import dataclasses

        from perfmodel.model.transformer import step_ops

        seqs = max(min(seqs, tokens), 1)
        q = [tokens - seqs + 1] + [1] * (seqs - 1)
        step = dataclasses.replace(self._template, batch=seqs, query_lens=tuple(q), context_lens=tuple(q),
                                   context_tokens=max(q))
        total = layer = head = 0.0
        for op in step_ops(self.model, step, self.cfg.chip):
            if op.name in self._context_ops:
                continue
            t = op.expected_s / self._factor(op.name)
            total += t
            if op.count == self.model.num_layers:
                layer += t / op.count
            elif op.block in ("head", "embed"):
                head += t
        return total, layer, head

    # ------------------------------------------------------------------ attention tables

    def _rows(self, q: np.ndarray, c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """([N, kernel, unit + 1] seconds, [kernel] launch seconds) of N sequences priced alone."""
        from perfmodel.model.core import UNITS, additive_times
        from perfmodel.model.transformer import sequence_attention_ops

        rows = sequence_attention_ops(self.model, self._template, self.cfg.chip, q, c)
        if self._kernels is None:
            self._kernels = [_Kernel(name=n, layers=layers, speedup=self._factor(n)) for n, layers, _ in rows]
            self._scale = np.asarray([k.layers / k.speedup for k in self._kernels])
        n = len(q)
        units = len(UNITS)
        out = np.zeros((n, len(rows), units + 1))
        launch = np.zeros(len(rows))
        for k, (_, _, cost) in enumerate(rows):
            ach, own, lat = additive_times(cost, self.cfg.chip)
            out[:, k, :units] = np.broadcast_to(ach, (units, n)).T
            out[:, k, units] = np.broadcast_to(own, (n,))
            launch[k] = float(np.max(lat))
        if self._launch is None:
            self._launch = launch
        return out, launch

    def _decode_table(self, pages: int) -> np.ndarray:
        """Decode rows for contexts of 1..``pages`` whole pages (grown on demand, doubling)."""
        have = self._dec.shape[0]
        if pages > have:
            want = max(pages, 2 * have, 64)
            ctx = np.arange(1, want + 1, dtype=np.int64) * self.page
            rows, launch = self._rows(np.ones(want, dtype=np.int64), ctx)
            self._dec, self._launch = rows, launch
        return self._dec

    def _qrow(self, qg: int) -> np.ndarray:
        row = self._qrows.get(qg)
        if row is None:
            prefix = np.arange(self._prefix_points, dtype=np.int64) * PREFIX_GRID_TOKENS
            row = self._qrows[qg] = self._rows(np.full(len(prefix), qg, dtype=np.int64), prefix + qg)[0]
        return row

    def _chunk_row(self, q: int, c: int) -> np.ndarray:
        """[kernel, unit + 1] seconds of one sequence pushing ``q`` > 1 tokens over ``c`` KV tokens (bilinear on
        the grid; exact at grid points); remembered per (q, c)."""
        hit = self._chunks.get((q, c))
        if hit is None:
            hit = self._chunks[(q, c)] = self._chunk_row_eval(q, c)
        return hit

    def _chunk_row_eval(self, q: int, c: int) -> np.ndarray:
        return self.chunk_rows(q, c)

    def chunk_rows(self, q: int, contexts: np.ndarray | int) -> np.ndarray:
        """[N, kernel, unit + 1] seconds of N sequences each pushing ``q`` > 1 tokens over ``contexts`` KV tokens
        ([kernel, unit + 1] for one context given as an int): bilinear on the (query, prior context) grid."""
        if isinstance(contexts, int):  # one context: the same arithmetic on Python numbers (no 0-d arrays)
            prefix = max(contexts - q, 0) / PREFIX_GRID_TOKENS
            i = min(int(prefix), self._prefix_points - 2)
            wp = prefix - i
        else:
            prefix = np.maximum(np.asarray(contexts, dtype=np.int64) - q, 0) / PREFIX_GRID_TOKENS
            i = np.minimum(prefix.astype(np.int64), self._prefix_points - 2)
            wp = (prefix - i)[:, None, None]
        out = 0.0
        for row, w in self._query_rows(q):
            out = out + w * ((1.0 - wp) * row[i] + wp * row[i + 1])
        return out

    def _query_rows(self, q: int) -> list[tuple[np.ndarray, float]]:
        """The grid rows that query length ``q`` interpolates between, with their weights (remembered per q)."""
        hit = self._qweights.get(q)
        if hit is None:
            grid = self._qgrid
            j = min(max(int(np.searchsorted(grid, q)), 1), len(grid) - 1)
            q0, q1 = int(grid[j - 1]), int(grid[j])
            wq = 0.0 if q1 == q0 else (q - q0) / (q1 - q0)
            hit = self._qweights[q] = ([(self._qrow(q0), 1.0)] if (q <= q0 or wq <= 0.0)
                                       else [(self._qrow(q0), 1.0 - wq), (self._qrow(q1), wq)])
        return hit

    def kernel_time(self, parts: np.ndarray) -> float:
        """Attention seconds of a step from its sequences' summed [kernel, unit + 1] seconds (at least one
        sequence)."""
        return float(self.kernel_times(parts))

    def attention_s(self, dec_ctx: np.ndarray, chunks: list[tuple[int, int]] = ()) -> float:
        """Attention seconds of a step: decode sequences over ``dec_ctx`` KV tokens each, and (q, c) chunks."""
        parts = self.attention_parts(dec_ctx, chunks)
        return self._kernel_time(parts)

    def chunk_parts(self, chunks: list[tuple[int, int]]) -> np.ndarray:
        """[kernel, unit + 1] summed seconds of (q, c) chunks (prefill chunks, q > 1, or decodes, q = 1)."""
        total = 0.0
        for q, c in chunks:
            total = total + (self._decode_table(-(-c // self.page))[-(-c // self.page) - 1] if q == 1
                             else self._chunk_row(q, c))
        return total

    def attention_parts(self, dec_ctx: np.ndarray, chunks: list[tuple[int, int]] = ()) -> np.ndarray:
        """[kernel, unit + 1] summed seconds of a step's sequences."""
        pages = np.asarray(-(-np.asarray(dec_ctx, dtype=np.int64) // self.page))
        top = int(pages.max()) if pages.size else 1
        table = self._decode_table(max(top, 1))
        total = table[pages - 1].sum(axis=0) if pages.size else np.zeros(table.shape[1:])
        return total + self.chunk_parts(chunks) if chunks else total

    def _kernel_time(self, parts: np.ndarray) -> float:
        if not parts.any():
            return 0.0
        return float(self.kernel_times(parts))

    def kernel_times(self, parts: np.ndarray) -> np.ndarray:
        """Attention seconds per step for summed parts [..., kernel, unit + 1] (one step, or a stack of them)."""
        per = parts[..., :-1].max(axis=-1) + parts[..., -1] + self._launch
        return per @ self._scale

    def decode_sums(self, rows: np.ndarray) -> np.ndarray:
        """[steps, kernel, unit + 1]: per step, the summed decode-table rows of its sequences (``rows``:
        [steps, sequences] table rows, pages - 1). A histogram of the rows times the table while that is small
        (a gather-and-sum over the middle axis is 5-10x slower), else a gather summed over sequences."""
        table = self.decode_table()
        pages = len(table)
        steps = rows.shape[0]
        flat = table.reshape(pages, -1)
        if steps * pages <= HISTOGRAM_CELLS:
            cells = rows.ravel() if steps == 1 else (rows + np.arange(steps)[:, None] * pages).ravel()
            # float counts: numpy's mixed int x float product spins a second BLAS thread for nothing
            out = np.bincount(cells, minlength=steps * pages).reshape(steps, pages).astype(np.float64) @ flat
        else:
            out = flat[rows.T].sum(axis=0)
        return out.reshape((steps,) + table.shape[1:])

    def decode_table(self) -> np.ndarray:
        """[pages, kernel, unit + 1] decode rows: row p - 1 is a context of p whole pages, for every context a
        request of ``max_model_len`` tokens reaches (speculative lookahead included), so the scheduler indexes
        it without a bounds check of its own (numpy's stops a longer one)."""
        return self._decode_table(self._max_pages)

    # ------------------------------------------------------------------ the step

    def padded(self, tokens: int, seqs: int) -> tuple[int, int]:
        """(padded tokens, padded requests) of a step (remembered per pair)."""
        key = (tokens, seqs)
        hit = self._padded.get(key)
        if hit is None:
            hit = self._padded[key] = (self.padding.tokens(tokens), self.padding.requests(seqs))
        return hit

    def step_s(self, dec_ctx: np.ndarray, chunks: list[tuple[int, int]] = (), *, spec_tokens: int = 0) -> float:
        """Device seconds of one step: ``len(dec_ctx)`` decode sequences (each pushing ``1 + spec_tokens`` tokens
        over its context) and the (q, c) chunks; plus the host overhead and the proposer's time."""
        n_dec = len(dec_ctx)
        tokens = n_dec * (1 + spec_tokens) + sum(q for q, _ in chunks)
        seqs = n_dec + len(chunks)
        if seqs == 0:
            return 0.0
        t_pad, b_pad = self.padded(tokens, seqs)
        if spec_tokens:
            verify = [(1 + spec_tokens, int(c)) for c in dec_ctx]
            att = self.attention_s(np.zeros(0, dtype=np.int64), list(chunks) + verify)
        else:
            att = self.attention_s(dec_ctx, chunks)
        return self.dense_s(t_pad, b_pad) + att + self.cfg.host_s(seqs)

    def layer_and_head_s(self, tokens: int, seqs: int) -> tuple[float, float]:
        """(one layer's dense seconds, the head's seconds) at a padded (tokens, seqs): a draft head's cost."""
        key = (tokens, seqs)
        hit = self._layer.get(key)
        if hit is None:
            _, layer, head = self._dense_eval(tokens, seqs)
            hit = self._layer[key] = (layer, head)
        return hit
