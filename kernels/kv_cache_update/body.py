"""Pallas TPU kernel bodies of the paged KV-cache update, one per layout (head-major, token-major, combined, and
the combined int8 form whose rows are quantized before the kernel), and the scalar-prefetch arrays the head-major
body reads (:func:`_head_major_plan`). Each body takes the call's
:class:`~kernels.kv_cache_update.plan.KvCacheUpdatePlan` as a static argument; the pallas_calls that run them are in
:mod:`kernels.kv_cache_update.kernel`."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from kernels import tiling
from kernels.kv_cache_update.plan import PADDING_SLOT, KvCacheUpdatePlan
from kernels.quant import quantize_int8


# ----- head-major: blocks of tokens in call order, each row written through its row granule -----

def _head_major_kernel(pages_ref: Any, rows_ref: Any, lead_ref: Any, full_ref: Any, *refs: Any,
                       plan: KvCacheUpdatePlan) -> None:
    # Scalar prefetch (SMEM, one entry per token, padded to whole blocks): pages_ref / rows_ref: its cache page
    # and row (-1 = skip); lead_ref: the block-local index of the block's first token on its row granule (whose
    # VMEM buffer assembles the granule); full_ref: 1 on a lead whose granule the block writes completely (no
    # read). Quantizing, the same two for the page scale rows.
    quantize, tokens_per_block, granule = plan.quantize, plan.tokens_per_block, plan.granule
    if quantize:
        scale_lead_ref, scale_full_ref = refs[:2]
        refs = refs[2:]
    n_caches = 4 if quantize else 2
    new_bufs = refs[:2]  # [tokens_per_block, kv_heads, head_dim]: the block's new K/V (pipelined VMEM blocks)
    outs = refs[2 + n_caches : 2 + 2 * n_caches]  # the aliased caches in HBM, written through these
    scratch = refs[2 + 2 * n_caches :]
    bufs = scratch[:n_caches]  # [tokens_per_block, kv_heads, granule, head_dim]; scales [.., kv_heads, 1, page]
    sems = scratch[-1]  # DMA semaphores: 0 granules in, 1 granules out
    base = pl.program_id(0) * tokens_per_block
    leads = ((lead_ref, full_ref),) * 2 + (((scale_lead_ref, scale_full_ref),) * 2 if quantize else ())

    def window(c: int, i: Any) -> Any:
        if c < 2:  # rows [r0, r0 + granule) of the token's page, every kv head
            r0 = pl.multiple_of(jax.lax.div(rows_ref[i], granule) * granule, granule)
            return outs[c].at[:, pages_ref[i], pl.ds(r0, granule), :]
        return outs[c].at[:, pl.ds(pages_ref[i], 1), :]  # the page's scale row, every kv head

    def each_token(fn: Any) -> None:
        def body(t: Any, carry: Any) -> Any:
            i = base + t

            @pl.when(rows_ref[i] >= 0)
            def _() -> None:
                fn(t, i)

            return carry

        jax.lax.fori_loop(0, tokens_per_block, body, 0, unroll=True)

    def fetch(action: str) -> Any:
        def fn(t: Any, i: Any) -> None:
            for c, (lead, full) in enumerate(leads):
                @pl.when(jnp.logical_and(lead[i] == t, full[i] == 0))
                def _() -> None:
                    getattr(pltpu.make_async_copy(window(c, i), bufs[c].at[t], sems.at[0]), action)()
        return fn

    def store(action: str) -> Any:
        def fn(t: Any, i: Any) -> None:
            for c, (lead, _) in enumerate(leads):
                @pl.when(lead[i] == t)
                def _() -> None:
                    getattr(pltpu.make_async_copy(bufs[c].at[t], window(c, i), sems.at[1]), action)()
        return fn

    def insert(t: Any, i: Any) -> None:
        row = rows_ref[i]
        if quantize:
            (kq, ks), (vq, vs) = (quantize_int8(new_bufs[c][t], axis=-1) for c in range(2))
            tokens = (kq, vq)
            for c, scale in ((2, ks), (3, vs)):  # scale [kv_heads, 1] into lane `row` of the page's scale row
                buf = bufs[c].at[scale_lead_ref[i]]
                kv_heads, _, page_size = buf.shape
                at = jax.lax.broadcasted_iota(jnp.int32, (kv_heads, 1, page_size), 2) == row
                buf[...] = jnp.where(at, jnp.broadcast_to(scale[:, :, None], buf.shape), buf[...])
        else:
            tokens = (new_bufs[0][t], new_bufs[1][t])
        for c in range(2):
            buf = bufs[c].at[lead_ref[i]]
            if granule == 1:
                buf[...] = tokens[c][:, None, :].astype(buf.dtype)
                continue
            # row-masked select in f32 (bf16/int8 widen and narrow back exactly): no sub-word sublane store
            at = jax.lax.broadcasted_iota(jnp.int32, buf.shape, 1) == jax.lax.rem(row, granule)
            new = jnp.broadcast_to(tokens[c].astype(jnp.float32)[:, None, :], buf.shape)
            buf[...] = jnp.where(at, new, buf[...].astype(jnp.float32)).astype(buf.dtype)

    each_token(fetch("start"))
    each_token(fetch("wait"))
    each_token(insert)
    each_token(store("start"))
    each_token(store("wait"))


def _granule_leads(keys: jax.Array, *, size: int, tokens_per_block: int) -> tuple[jax.Array, jax.Array]:
    """(lead, full) per token of ``keys`` (granule ids, -1 = skipped; a whole number of blocks): lead = the
    block-local index of the block's first token with the same key; full = 1 on a lead whose granule's ``size``
    rows are all written by tokens of that block (slots are distinct, so ``size`` tokens with one key cover it)."""
    blocks = keys.reshape(-1, tokens_per_block)
    same = blocks[:, :, None] == blocks[:, None, :]  # [blocks, t, t']: token t' on token t's granule
    lead = jnp.argmax(same, axis=-1).astype(jnp.int32)  # the first such t' (t itself at the latest)
    is_lead = lead == jnp.arange(tokens_per_block, dtype=jnp.int32)
    full = is_lead & (blocks >= 0) & (same.sum(axis=-1) == size)
    return lead.reshape(-1), full.astype(jnp.int32).reshape(-1)


def _head_major_plan(slot_mapping: jax.Array, *, page_size: int, granule: int, tokens_per_block: int,
                     quantize: bool) -> tuple[jax.Array, ...]:
    """Scalar-prefetch arrays of the head-major kernel, per token in call order, padded to whole blocks with
    skipped entries: (page, row, lead, full) and, quantizing, the page scale rows' (lead, full)."""
    num_tokens = slot_mapping.shape[0]
    padded = tiling.round_up(num_tokens, tokens_per_block)
    slots = jnp.pad(slot_mapping, (0, padded - num_tokens), constant_values=PADDING_SLOT)
    valid = slots >= 0
    pages = jnp.where(valid, slots // page_size, 0)
    rows = jnp.where(valid, slots % page_size, PADDING_SLOT)
    granules_per_page = tiling.cdiv(page_size, granule)
    keys = jnp.where(valid, pages * granules_per_page + rows // granule, PADDING_SLOT)
    plan = [pages, rows, *_granule_leads(keys, size=granule, tokens_per_block=tokens_per_block)]
    if quantize:
        plan += _granule_leads(jnp.where(valid, pages, PADDING_SLOT), size=page_size, tokens_per_block=tokens_per_block)
    return tuple(p.astype(jnp.int32) for p in plan)


# ----- token-major: blocks of tokens, one DMA per token -----

def _token_major_kernel(slots_ref: Any, *refs: Any, plan: KvCacheUpdatePlan) -> None:
    # slots_ref: [num_tokens_padded] int32 SMEM (scalar prefetch), -1 = skip
    tokens_per_block, quantize = plan.tokens_per_block, plan.quantize
    k_ref, v_ref = refs[:2]  # [tokens_per_block, kv_heads, head_dim] VMEM blocks of the new tokens
    n_caches = 4 if quantize else 2
    # refs[2 : 2 + n_caches]: the aliased cache inputs (HBM); written through the outputs below.
    outs = refs[2 + n_caches : 2 + 2 * n_caches]
    # outs: k_cache, v_cache [num_slots, kv_heads, head_dim] HBM; (quantize) k_scale, v_scale [num_slots, kv_heads, 1]
    scratch = refs[2 + 2 * n_caches :]
    sems = scratch[-1]  # [n_caches] DMA semaphores, one per destination cache
    if quantize:
        kq_ref, vq_ref, ks_ref, vs_ref = scratch[:4]  # [bt, kv_heads, head_dim] int8; [bt, kv_heads, 1] f32
        kq, ks = quantize_int8(k_ref[...], axis=-1)
        vq, vs = quantize_int8(v_ref[...], axis=-1)
        kq_ref[...], vq_ref[...], ks_ref[...], vs_ref[...] = kq, vq, ks, vs
        sources = (kq_ref, vq_ref, ks_ref, vs_ref)
    else:
        sources = (k_ref, v_ref)
    _copy_rows(slots_ref, tokens_per_block, lambda t, slot: [
        pltpu.make_async_copy(src.at[t], dst.at[slot], sems.at[c]) for c, (src, dst) in enumerate(zip(sources, outs))
    ])


def _copy_rows(slots_ref: Any, tokens_per_block: int, copies: Any) -> None:
    """Start ``copies(t, slot)`` (VMEM row t -> cache slot) for every valid token of this grid step's block, then
    wait for them all: every copy of a block is in flight together; the waits follow (one per copy, all the
    same size, on the semaphore it signals)."""
    base = pl.program_id(0) * tokens_per_block

    def for_valid_tokens(action: str) -> None:
        def body(t: Any, carry: Any) -> Any:
            slot = slots_ref[base + t]

            @pl.when(slot >= 0)
            def _() -> None:
                for copy in copies(t, slot):
                    getattr(copy, action)()

            return carry

        jax.lax.fori_loop(0, tokens_per_block, body, 0, unroll=True)

    for_valid_tokens("start")
    for_valid_tokens("wait")


# ----- combined: K and V interleaved in one cache, one DMA per token -----

def _combined_kernel(slots_ref: Any, k_ref: Any, v_ref: Any, kv_in_ref: Any, kv_ref: Any, rows_ref: Any,
                     sem: Any, *, plan: KvCacheUpdatePlan) -> None:
    # slots_ref: [num_tokens_padded] int32 SMEM (scalar prefetch), -1 = skip
    # k_ref, v_ref: [tokens_per_block, kv_heads, head_dim] VMEM blocks of the new tokens
    # kv_in_ref / kv_ref: the aliased cache [num_slots, 2 * kv_heads, head_dim] in HBM (written through kv_ref)
    # rows_ref: [tokens_per_block, 2 * kv_heads, head_dim] VMEM scratch: the block's cache rows, K/V interleaved
    del kv_in_ref
    for h in range(k_ref.shape[1]):  # one sublane per store: row 2h <- K of head h, 2h + 1 <- its V
        rows_ref[:, pl.ds(2 * h, 1), :] = k_ref[:, pl.ds(h, 1), :]
        rows_ref[:, pl.ds(2 * h + 1, 1), :] = v_ref[:, pl.ds(h, 1), :]
    _copy_rows(slots_ref, plan.tokens_per_block,
               lambda t, slot: [pltpu.make_async_copy(rows_ref.at[t], kv_ref.at[slot], sem.at[0])])


def _combined_rows_kernel(slots_ref: Any, rows_ref: Any, kv_in_ref: Any, kv_ref: Any, sem: Any, *,
                          plan: KvCacheUpdatePlan) -> None:
    # rows_ref: [tokens_per_block, 2 * kv_heads, head_dim] VMEM block of the new tokens' cache rows, K/V interleaved
    # kv_in_ref / kv_ref: the aliased cache [num_slots, 2 * kv_heads, head_dim] in HBM (written through kv_ref)
    del kv_in_ref
    _copy_rows(slots_ref, plan.tokens_per_block,
               lambda t, slot: [pltpu.make_async_copy(rows_ref.at[t], kv_ref.at[slot], sem.at[0])])
