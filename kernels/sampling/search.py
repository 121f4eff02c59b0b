"""The kernel's threshold searches and the in-kernel helpers they fold passes with: the order-preserving int32
keys of f32 the bisections halve (:func:`_key`), one pass over the resident rows (:func:`_fold_rows`), the capture
pass (:func:`_lane_top`), the per-row top-k / top-p / min-p threshold (:func:`_thresholds`, which the kernel body
runs), its pass bounds (``MAX_BISECTION_STEPS``, ``MAX_SEARCH_PASSES``) and :func:`search_passes`, a diagnostic
that runs the same search in Pallas interpret mode and reports the passes it made."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from kernels.sampling.options import row_options
from kernels.sampling.plan import (
    _F_GREEDY,
    _F_INV_TEMP,
    _F_MIN_P,
    _F_TOP_P,
    _I_TOP_K,
    N_OPTS_F,
    N_OPTS_I,
    Filters,
    _packed_options,
    lane_group,
)

#: Bisection steps that always suffice: each halves a range of at most 2**32 int32 keys.
MAX_BISECTION_STEPS = 32
#: Passes a threshold search may make: the bracket's probe (see :func:`_thresholds`), then the bisection.
MAX_SEARCH_PASSES = MAX_BISECTION_STEPS + 1


def _key(x: jax.Array) -> jax.Array:
    """Order-preserving int32 image of f32 (an involution: _key(_key(x)) as bits == x)."""
    bits = lax.bitcast_convert_type(x, jnp.int32)
    return bits ^ (lax.shift_right_arithmetic(bits, jnp.int32(31)) & jnp.int32(0x7FFFFFFF))


def _unkey(k: jax.Array) -> jax.Array:
    bits = k ^ (lax.shift_right_arithmetic(k, jnp.int32(31)) & jnp.int32(0x7FFFFFFF))
    return lax.bitcast_convert_type(bits, jnp.float32)


def _midpoint(lo: jax.Array, hi: jax.Array) -> jax.Array:
    """floor((lo + hi) / 2) without int32 overflow."""
    one = jnp.int32(1)
    return lax.shift_right_arithmetic(lo, one) + lax.shift_right_arithmetic(hi, one) + (lo & hi & one)


def _any(flags: jax.Array) -> jax.Array:
    return jnp.max(jnp.where(flags, 1.0, 0.0)) > 0.0


def _column(ref, k: int) -> jax.Array:
    return ref[:, k:k + 1]


def _resident_z(rows: jax.Array, inv_t: jax.Array) -> jax.Array:
    """Scaled logits z of a block of the resident rows: f32 rows hold z itself (phase 0 stores ``x * inv_t``, so
    no pass multiplies again); rows in the logits' narrower dtype hold x, scaled here in f32."""
    return rows if rows.dtype == jnp.float32 else rows.astype(jnp.float32) * inv_t


def _fold_rows(rows_ref, inv_t_col, width: int, step, init):
    """One pass over the resident rows: ``step(z, cols, acc)`` on each [block_b, width] lane group of scaled logits
    ``z`` (vocab indices ``cols`` as exact f32 integers, one vector add from a scalar offset), chunk by chunk;
    lane-wide accumulators, so nothing spills."""
    vocab_blocks, block_b, block_v = rows_ref.shape
    inv_t = jnp.broadcast_to(inv_t_col, (block_b, width))
    lane_iota = lax.broadcasted_iota(jnp.int32, (block_b, width), 1).astype(jnp.float32)

    def chunk(c, acc):
        for g in range(block_v // width):
            z = _resident_z(rows_ref[c, :, pl.ds(g * width, width)], inv_t)
            acc = step(z, lane_iota + (c * block_v + g * width).astype(jnp.float32), acc)
        return acc

    return lax.fori_loop(0, vocab_blocks, chunk, init)


def _largest_key_reaching(values: jax.Array, weights: jax.Array, target: jax.Array) -> jax.Array:
    """Per row, the largest int32 key ``t`` with ``sum(weights where values >= _unkey(t)) >= target`` over a small
    lane-wide array (values / weights [block_b, width], target [block_b, 1]): 32 halvings of the key range, no
    pass over the rows. ``_key(-inf)`` where no value reaches the target (e.g. fewer than k values)."""
    lo = jnp.full(target.shape, _key(jnp.float32(-jnp.inf)), jnp.int32)
    hi = _key(jnp.max(values, axis=1, keepdims=True)) + 1

    def halve(_, state):
        lo, hi = state
        mid = _midpoint(lo, hi)
        above = values >= jnp.broadcast_to(_unkey(mid), values.shape)
        reached = jnp.sum(jnp.where(above, weights, 0.0), axis=1, keepdims=True) >= target
        return jnp.where(reached, mid, lo), jnp.where(reached, hi, mid)

    return lax.fori_loop(0, MAX_BISECTION_STEPS, halve, (lo, hi))[0]


#: z values per lane the capture pass keeps (see :func:`_thresholds`).
CAPTURE_SLOTS = 5


def _lane_top(rows_ref, inv_t, width: int) -> tuple[jax.Array, ...]:
    """One pass: each lane's CAPTURE_SLOTS largest z (duplicates kept), descending, as CAPTURE_SLOTS [block_b, width]
    arrays; -inf in the slots of a lane with fewer finite values."""
    _, block_b, _ = rows_ref.shape

    def step(z, cols, slots):
        out, carry = [], z
        for slot in slots:  # insert into a sorted list: each slot keeps the larger, passes the smaller down
            out.append(jnp.maximum(slot, carry))
            carry = jnp.minimum(slot, carry)
        return tuple(out)

    init = tuple(jnp.full((block_b, width), -jnp.inf, jnp.float32) for _ in range(CAPTURE_SLOTS))
    return _fold_rows(rows_ref, inv_t, width, step, init)


def _thresholds(rows_ref, opts_f_ref, opts_i_ref, greedy, z_max, lane_max, *, vocab: int, filters: Filters,
                width: int, capture: bool = True):
    """Per-row threshold max(top-k, top-p, min-p) on z, by bisection passes over the resident rows, and the passes
    each search made (int32 scalars).

    Filters the call did not pass (``filters``) are not compiled at all. Each pass folds the chunks into
    lane-wide [block_b, width] count (and mass) accumulators and reduces them across lanes once.

    Capture (with top-k, ``capture``): one pass keeps each lane's CAPTURE_SLOTS largest z. A lane's uncaptured
    elements are at most its last slot, so where a row's k-th largest captured value t* lies above every lane's
    last slot, the captured values >= t* are exactly the row's top-k set: t* is its threshold, and the top-p
    threshold is found on the captured values' masses. Where every top-k row of the block is so (and no row has
    top-p without top-k) no other pass runs; else the searches below run for the whole block.

    Brackets: phase 0's lane-wide maxima ``lane_max`` [block_b, width] are ``width`` distinct elements of each
    row, so the k-th largest of them has at least k elements at or above it, and the largest lane maximum whose
    lane maxima at or above it (inside the top-k set) carry the top-p mass has at least that mass above it. Each
    search's first pass probes that bracket instead of the midpoint of the whole float range; the probe is a pass
    like any other (the search moves on the count or mass it measures), so a bracket that misses costs one pass
    and never changes the threshold.
    """
    vocab_blocks, block_b, block_v = rows_ref.shape
    shape = (block_b, 1)
    inv_t = _column(opts_f_ref, _F_INV_TEMP)
    top_k = _column(opts_i_ref, _I_TOP_K).astype(jnp.float32)
    top_p = _column(opts_f_ref, _F_TOP_P)
    min_p = _column(opts_f_ref, _F_MIN_P)
    no_cut = jnp.full(shape, -jnp.inf, jnp.float32)
    all_count = jnp.full(shape, float(vocab_blocks * block_v), jnp.float32)  # -inf padding counts at -inf
    above_max = _key(z_max) + 1
    zero = jnp.zeros((block_b, width), jnp.float32)
    z_max_w = jnp.broadcast_to(z_max, (block_b, width))
    key_neg_inf = _key(jnp.float32(-jnp.inf))

    def count_and_mass(t, with_mass: bool):
        t_w = jnp.broadcast_to(t, (block_b, width))

        def step(z, cols, acc):
            above = z >= t_w
            if not with_mass:
                return acc + jnp.where(above, 1.0, 0.0)
            count, mass = acc
            return count + jnp.where(above, 1.0, 0.0), mass + jnp.where(above, jnp.exp(z - z_max_w), 0.0)

        acc = _fold_rows(rows_ref, inv_t, width, step, (zero, zero) if with_mass else zero)
        count, mass = acc if with_mass else (acc, zero)
        return jnp.sum(count, axis=1, keepdims=True), jnp.sum(mass, axis=1, keepdims=True)

    def mass_weights(values, cut):
        """exp(z - max) of the values at or above the per-row ``cut``, 0 elsewhere (the top-p mass they carry)."""
        above = values >= jnp.broadcast_to(cut, values.shape)
        return jnp.where(above, jnp.exp(values - jnp.broadcast_to(z_max, values.shape)), 0.0)

    def probe(it, bracket, lo, hi):
        """The candidate of pass ``it``: the bracket first where it lies inside (lo, hi), else the midpoint."""
        return jnp.where((it == 0) & (bracket > lo) & (bracket < hi), bracket, _midpoint(lo, hi))

    use_k = jnp.logical_not(greedy) & (top_k < float(vocab))

    def top_k_search():
        """Largest key lo with count(z >= lo) >= k; a row is done when its count is exactly k."""
        lo0 = jnp.full(shape, key_neg_inf, jnp.int32)
        bracket = _largest_key_reaching(lane_max, jnp.ones_like(lane_max), top_k)

        def k_pending(state):
            _, lo, hi, count_lo = state
            return use_k & (count_lo != top_k) & (lo + 1 < hi)

        def k_cond(state):
            return (state[0] < MAX_SEARCH_PASSES) & _any(k_pending(state))

        def k_body(state):
            it, lo, hi, count_lo = state
            pending = k_pending(state)
            mid = probe(it, bracket, lo, hi)
            count, _ = count_and_mass(_unkey(mid), with_mass=False)
            up = pending & (count >= top_k)
            down = pending & (count < top_k)
            return it + 1, jnp.where(up, mid, lo), jnp.where(down, mid, hi), jnp.where(up, count, count_lo)

        passes, k_lo, _, k_count = lax.while_loop(k_cond, k_body, (jnp.int32(0), lo0, above_max, all_count))
        t_k = jnp.where(use_k, _unkey(k_lo), no_cut)
        count_k = jnp.where(use_k, k_count, all_count)
        return t_k, count_k, passes

    use_p = jnp.logical_not(greedy) & (top_p < 1.0)

    def top_p_search(t_k, count_k):
        """Largest key lo with mass(z >= lo) >= top_p * mass(top-k set); a row is done when one element is
        left in [lo, hi)."""
        _, mass_k = count_and_mass(t_k, with_mass=True)
        target = top_p * mass_k
        bracket = _largest_key_reaching(lane_max, mass_weights(lane_max, t_k), target)

        def p_pending(state):
            _, lo, hi, count_lo, count_hi = state
            return use_p & (count_lo - count_hi > 1.0) & (lo + 1 < hi)

        def p_cond(state):
            return (state[0] < MAX_SEARCH_PASSES) & _any(p_pending(state))

        def p_body(state):
            it, lo, hi, count_lo, count_hi = state
            pending = p_pending(state)
            mid = probe(it, bracket, lo, hi)
            count, mass = count_and_mass(_unkey(mid), with_mass=True)
            up = pending & (mass >= target)
            down = pending & (mass < target)
            return (it + 1, jnp.where(up, mid, lo), jnp.where(down, mid, hi), jnp.where(up, count, count_lo),
                    jnp.where(down, count, count_hi))

        init = (jnp.int32(0), _key(t_k), above_max, count_k, jnp.zeros(shape, jnp.float32))
        passes, p_lo, _, _, _ = lax.while_loop(p_cond, p_body, init)
        return jnp.where(use_p, _unkey(p_lo), no_cut), passes

    def searched():
        """The pass-by-pass searches: (cut, top-k passes, top-p passes)."""
        cut, count, k_passes, p_passes = no_cut, all_count, jnp.int32(0), jnp.int32(0)
        if filters.top_k:
            cut, count, k_passes = top_k_search()
        if filters.top_p:
            def with_top_p():
                t_p, passes = top_p_search(cut, count)
                return jnp.maximum(cut, t_p), passes

            cut, p_passes = lax.cond(_any(use_p), with_top_p, lambda: (cut, jnp.int32(0)))
        return cut, k_passes, p_passes

    if filters.top_k and capture:
        # One pass keeps each lane's CAPTURE_SLOTS largest z; where every top-k row's k-th largest captured value
        # lies above every lane's last slot, the captured values hold the whole top-k set (a lane's uncaptured
        # elements are at most its last slot), so top-k and top-p are read off [block_b, slots * width] values.
        slots = _lane_top(rows_ref, inv_t, width)
        captured = jnp.concatenate(slots, axis=1)
        t_star = _unkey(_largest_key_reaching(captured, jnp.ones_like(captured), top_k))
        exact = jnp.max(slots[-1], axis=1, keepdims=True) < t_star
        ok = jnp.logical_not(use_k | use_p) | (use_k & exact)  # top-p without top-k: the set can be any size

        def from_captured():
            cut = jnp.where(use_k, t_star, no_cut)
            if filters.top_p:
                weights = mass_weights(captured, cut)
                target = top_p * jnp.sum(weights, axis=1, keepdims=True)
                t_p = _unkey(_largest_key_reaching(captured, weights, target))
                cut = jnp.maximum(cut, jnp.where(use_p, t_p, no_cut))
            return cut, jnp.int32(1), jnp.int32(0), jnp.int32(1)

        def by_passes():
            cut, k_passes, p_passes = searched()
            return cut, k_passes + 1, p_passes, jnp.int32(0)

        cut, k_passes, p_passes, captured_only = lax.cond(jnp.logical_not(_any(jnp.logical_not(ok))),
                                                          from_captured, by_passes)
    else:
        (cut, k_passes, p_passes), captured_only = searched(), jnp.int32(0)
    if filters.min_p:
        cut = jnp.maximum(cut, jnp.where(jnp.logical_not(greedy) & (min_p > 0.0), z_max + jnp.log(min_p), no_cut))
    return cut, k_passes, p_passes, captured_only


def search_passes(logits, *, top_k=None, top_p=None, temperature=1.0, block_b: int = 16, block_v: int = 8192,
                  brackets: bool = True, capture: bool = True):
    """The passes the kernel's threshold searches make on ``logits`` [batch, vocab] (a diagnostic: the same
    ``_thresholds`` the kernel runs, in Pallas interpret mode on this host, over f32 rows with no penalties or
    bias). Returns ``(thresholds [batch] f32, passes [row blocks, 3] int32)``: per block of ``block_b`` rows, the
    passes over the resident rows made for top-k (the capture pass included) and for top-p (0 where the filter is
    off), and 1 where the block's thresholds came from the captured values alone. ``brackets=False`` hides the
    lane maxima (all -inf), so every search pass bisects; ``capture=False`` leaves the capture pass out: the
    searches as they were before each."""
    logits = jnp.asarray(logits, jnp.float32)
    batch, vocab = logits.shape
    opts = row_options(batch=batch, vocab=vocab, temperature=temperature, top_k=top_k, top_p=top_p, min_p=None,
                       random=True)
    filters = Filters(top_k=top_k is not None, top_p=top_p is not None, min_p=False)
    width = lane_group(block_v)
    row_blocks, vocab_blocks = pl.cdiv(batch, block_b), pl.cdiv(vocab, block_v)
    pad_b = row_blocks * block_b - batch
    rows = jnp.pad(logits, ((0, pad_b), (0, vocab_blocks * block_v - vocab)), constant_values=-jnp.inf)
    opts_f, opts_i = _packed_options(opts.inv_temperature, opts.top_p, opts.min_p, opts.greedy,
                                     opts.presence_penalty, opts.frequency_penalty, opts.repetition_penalty,
                                     opts.top_k, jnp.zeros_like(opts.top_k), padded=pad_b, vocab=vocab)
    z = rows * opts_f[:, _F_INV_TEMP:_F_INV_TEMP + 1]  # f32 resident rows hold z (_resident_z)
    lane_max = jnp.max(z.reshape(z.shape[0], -1, width), axis=1)  # phase 0's lane-wide maxima
    z_max = jnp.max(lane_max, axis=1, keepdims=True)
    if not brackets:
        lane_max = jnp.full_like(lane_max, -jnp.inf)
    rows = z.reshape(z.shape[0], vocab_blocks, block_v).transpose(1, 0, 2)

    def kernel(rows_ref, opts_f_ref, opts_i_ref, z_max_ref, lane_max_ref, cut_ref, passes_ref):
        # rows_ref [vocab_blocks, block_b, block_v] f32; opts [block_b, 7 / 2]; z_max [block_b, 1];
        # lane_max [block_b, width]; cut_ref [block_b, 1] f32; passes_ref [1, 3] int32 (SMEM)
        cut, k_passes, p_passes, captured_only = _thresholds(
            rows_ref, opts_f_ref, opts_i_ref, _column(opts_f_ref, _F_GREEDY) > 0.5, z_max_ref[...],
            lane_max_ref[...], vocab=vocab, filters=filters, width=width, capture=capture)
        cut_ref[...] = cut
        passes_ref[0, 0], passes_ref[0, 1], passes_ref[0, 2] = k_passes, p_passes, captured_only

    def row(width_):
        return pl.BlockSpec((block_b, width_), lambda i: (i, 0))

    cut, passes = pl.pallas_call(
        kernel, grid=(row_blocks,),
        in_specs=[pl.BlockSpec((vocab_blocks, block_b, block_v), lambda i: (0, i, 0)), row(N_OPTS_F),
                  row(N_OPTS_I), row(1), row(width)],
        out_specs=[row(1), pl.BlockSpec((1, 3), lambda i: (i, 0), memory_space=pltpu.SMEM)],
        out_shape=[jax.ShapeDtypeStruct((rows.shape[1], 1), jnp.float32),
                   jax.ShapeDtypeStruct((row_blocks, 3), jnp.int32)],
        interpret=True,
    )(rows, opts_f, opts_i, z_max, lane_max)
    return np.asarray(cut[:batch, 0]), np.asarray(passes)
