"""Paged KV-cache update for TPU (Pallas/Mosaic): scatter a step's new K/V tokens into their slots.

Layout
------
* new_k, new_v: [num_tokens, kv_heads, head_dim] (bf16 or f32).
* k_cache, v_cache: [num_pages, page_size, kv_heads, head_dim], token-major
  pages: one token's [kv_heads, head_dim] slab is contiguous, so each token is
  one DMA whose offsets fall only on leading (untiled) dimensions - Mosaic
  requires DMA slices of the two tiled minor dimensions to be tile-aligned,
  which a per-token write into [.., page_size, head_dim] minor dims is not.
  A cache row pads to the dtype's tile in HBM when kv_heads is below its
  sublane multiple (8 f32, 16 bf16, 32 int8).
* slot_mapping: int32 [num_tokens]; slot = page * page_size + offset;
  -1 marks a padding token that is not written. Slots must be distinct.
* Quantize on write: an int8 cache takes the tokens quantized symmetrically per
  (token, head) over head_dim, with the f32 scales in k_scale_cache /
  v_scale_cache [num_pages, page_size, kv_heads, 1] (the trailing 1 keeps each
  token's scales a whole (kv_heads, 1) tile, again so the per-token DMA is
  legal); dequantize as q * scale.

Kernel
------
slot_mapping is scalar-prefetched into SMEM. Grid: one "parallel" axis over
blocks of tokens_per_block tokens whose K/V slabs are pipelined into VMEM; the
body starts one VMEM->HBM DMA per (valid token, cache) and then waits for all
of them (one DMA semaphore per cache, all copies the same size). The caches
stay in HBM (memory_space=ANY) and are aliased input->output
(input_output_aliases); the jitted wrapper donates them, so with donation the
update is in place and the caller's cache arrays are consumed.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from kernels.common import DEFAULT_CHIP, interpret_params
from kernels.kv_cache_update.blocks import KvCacheUpdateBlockSizes, default_block_sizes
from kernels.matmul import tiling
from kernels.matmul.quant import quantize_int8

_FLOAT_INPUTS = ("float32", "bfloat16")
#: slot_mapping value of a token that is not written.
PADDING_SLOT = -1


def _kv_cache_update_kernel(slots_ref: Any, *refs: Any, tokens_per_block: int, quantize: bool) -> None:
    # slots_ref: [num_tokens_padded] int32 SMEM (scalar prefetch), -1 = skip
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
    base = pl.program_id(0) * tokens_per_block

    def copies(t: Any, slot: Any) -> list[Any]:
        return [
            pltpu.make_async_copy(src.at[t], dst.at[slot], sems.at[c])
            for c, (src, dst) in enumerate(zip(sources, outs))
        ]

    def for_valid_tokens(action: str) -> None:
        def body(t: Any, carry: Any) -> Any:
            slot = slots_ref[base + t]

            @pl.when(slot >= 0)
            def _() -> None:
                for copy in copies(t, slot):
                    getattr(copy, action)()

            return carry

        jax.lax.fori_loop(0, tokens_per_block, body, 0)

    for_valid_tokens("start")
    for_valid_tokens("wait")


def _is_concrete(x: Any) -> bool:
    return not isinstance(x, jax.core.Tracer)


def _check_inputs(new_k: Any, new_v: Any, k_cache: Any, v_cache: Any, slot_mapping: Any,
                  k_scale_cache: Any, v_scale_cache: Any) -> bool:
    """Validate shapes/dtypes (and slot values when concrete); returns whether the caches quantize."""
    if getattr(new_k, "ndim", None) != 3:
        raise ValueError(f"new_k: expected [num_tokens, kv_heads, head_dim], got shape {getattr(new_k, 'shape', None)}")
    if getattr(new_v, "shape", None) != new_k.shape or new_v.dtype != new_k.dtype:
        raise ValueError(f"new_v: {getattr(new_v, 'dtype', None)}{list(getattr(new_v, 'shape', []))} must match "
                         f"new_k's {new_k.dtype}{list(new_k.shape)}")
    if jnp.dtype(new_k.dtype).name not in _FLOAT_INPUTS:
        raise ValueError(f"new_k: dtype {jnp.dtype(new_k.dtype).name} not supported; use bfloat16 or float32")
    num_tokens, kv_heads, head_dim = new_k.shape
    if num_tokens == 0:
        raise ValueError("new_k: no tokens (num_tokens == 0)")
    if getattr(k_cache, "ndim", None) != 4 or tuple(k_cache.shape[2:]) != (kv_heads, head_dim):
        raise ValueError(f"k_cache: expected [num_pages, page_size, {kv_heads}, {head_dim}] to match new_k, "
                         f"got shape {getattr(k_cache, 'shape', None)}")
    if getattr(v_cache, "shape", None) != k_cache.shape or v_cache.dtype != k_cache.dtype:
        raise ValueError(f"v_cache: {getattr(v_cache, 'dtype', None)}{list(getattr(v_cache, 'shape', []))} must match "
                         f"k_cache's {k_cache.dtype}{list(k_cache.shape)}")
    quantize = k_cache.dtype == jnp.int8
    if not quantize and k_cache.dtype != new_k.dtype:
        raise ValueError(f"k_cache: dtype {k_cache.dtype} must equal new_k's ({new_k.dtype}) or be int8 (quantize on write)")
    pages, page_size = k_cache.shape[:2]
    scale_shape = (pages, page_size, kv_heads, 1)
    for name, scale in (("k_scale_cache", k_scale_cache), ("v_scale_cache", v_scale_cache)):
        if not quantize and scale is not None:
            raise ValueError(f"{name}: only an int8 cache takes scales; k_cache is {k_cache.dtype}")
        if quantize and (scale is None or tuple(scale.shape) != scale_shape or scale.dtype != jnp.float32):
            got = "None" if scale is None else f"{scale.dtype}{list(scale.shape)}"
            raise ValueError(f"{name}: an int8 cache needs a float32 scale cache of shape {list(scale_shape)}, got {got}")
    if (getattr(slot_mapping, "shape", None) != (num_tokens,)
            or not jnp.issubdtype(slot_mapping.dtype, jnp.integer)):
        raise ValueError(f"slot_mapping: expected int32[{num_tokens}] (one slot per token), got "
                         f"{getattr(slot_mapping, 'dtype', None)}{list(getattr(slot_mapping, 'shape', []))}")
    if _is_concrete(slot_mapping):
        _check_slot_values(np.asarray(slot_mapping), pages * page_size)
    return bool(quantize)


def _check_slot_values(slots: np.ndarray, num_slots: int) -> None:
    bad = np.flatnonzero((slots >= num_slots) | (slots < PADDING_SLOT))
    if bad.size:
        t = int(bad[0])
        raise ValueError(f"slot_mapping: token {t} has slot {int(slots[t])}, outside the cache's {num_slots} slots "
                         f"(num_pages * page_size); use 0..{num_slots - 1}, or {PADDING_SLOT} to skip the token")
    valid = slots[slots >= 0]
    values, counts = np.unique(valid, return_counts=True)
    if np.any(counts > 1):
        raise ValueError(f"slot_mapping: slot {int(values[counts > 1][0])} is written by more than one token; "
                         "slots must be distinct")


def kv_cache_update(
    new_k: jax.Array,
    new_v: jax.Array,
    k_cache: jax.Array,
    v_cache: jax.Array,
    slot_mapping: jax.Array,
    *,
    k_scale_cache: jax.Array | None = None,
    v_scale_cache: jax.Array | None = None,
    block_sizes: KvCacheUpdateBlockSizes | None = None,
    chip: str = DEFAULT_CHIP,
    interpret: bool = False,
) -> tuple[jax.Array, ...]:
    """Write each new token's K/V into its paged cache slot, in place (see the module docstring for layouts).

    The caches (and scale caches) are donated: after the call the arrays passed in
    are consumed; use the returned ones.

    Returns:
      (k_cache, v_cache), or for int8 caches (k_cache, v_cache, k_scale_cache, v_scale_cache).
    """
    quantize = _check_inputs(new_k, new_v, k_cache, v_cache, slot_mapping, k_scale_cache, v_scale_cache)
    spec = tiling.resolve_tpu_chip(chip)
    num_tokens, kv_heads, head_dim = new_k.shape
    if block_sizes is None:
        block_sizes = default_block_sizes(spec.name)
    elif not isinstance(block_sizes, KvCacheUpdateBlockSizes):
        raise ValueError(f"block_sizes: expected a KvCacheUpdateBlockSizes, got {type(block_sizes).__name__}")
    vmem_limit = block_sizes.check(
        kv_heads=kv_heads, head_dim=head_dim, new_dtype=new_k.dtype, quantize=quantize, chip=spec
    )
    tokens_per_block = min(block_sizes.tokens_per_block, num_tokens)
    padded_tokens = tiling.round_up(num_tokens, tokens_per_block)
    smem = spec.memory.smem_bytes_per_core
    if smem is not None and padded_tokens * 4 > smem // 2:
        raise ValueError(f"slot_mapping: {num_tokens} tokens need {padded_tokens * 4} B of SMEM, over half of "
                         f"{spec.name}'s {smem} B; split the update into smaller calls")
    return _kv_cache_update_jit(
        new_k, new_v, k_cache, v_cache, slot_mapping.astype(jnp.int32), k_scale_cache, v_scale_cache,
        tokens_per_block=tokens_per_block, vmem_limit_bytes=vmem_limit, interpret=interpret,
    )


def cost_estimate(*, num_tokens: int, kv_heads: int, head_dim: int, page_size: int, new_dtype: Any,
                  cache_dtype: Any) -> pl.CostEstimate:
    """The kernel's CostEstimate: perfmodel's KV-cache update model, algorithmic counts (chip=None).

    Counts every token of the call (padding tokens included: their number is not known under jit).
    """
    from perfmodel.model.core import to_cost_estimate
    from perfmodel.model.kvcache import kv_cache_update as kv_cache_update_model

    cost = kv_cache_update_model(
        num_tokens=num_tokens, kv_heads=kv_heads, head_dim=head_dim, page_size=page_size,
        kv_dtype=tiling.matmul_dtype_name(cache_dtype), src_dtype=tiling.matmul_dtype_name(new_dtype), chip=None,
    )
    return to_cost_estimate(cost)


@functools.partial(
    jax.jit,
    static_argnames=("tokens_per_block", "vmem_limit_bytes", "interpret"),
    donate_argnames=("k_cache", "v_cache", "k_scale_cache", "v_scale_cache"),
)
def _kv_cache_update_jit(
    new_k: jax.Array,
    new_v: jax.Array,
    k_cache: jax.Array,
    v_cache: jax.Array,
    slot_mapping: jax.Array,
    k_scale_cache: jax.Array | None,
    v_scale_cache: jax.Array | None,
    *,
    tokens_per_block: int,
    vmem_limit_bytes: int | None,
    interpret: bool,
) -> tuple[jax.Array, ...]:
    num_tokens, kv_heads, head_dim = new_k.shape
    quantize = k_scale_cache is not None
    caches = [k_cache, v_cache] + ([k_scale_cache, v_scale_cache] if quantize else [])
    shapes = [c.shape for c in caches]
    flat = [c.reshape(c.shape[0] * c.shape[1], *c.shape[2:]) for c in caches]  # leading dims only: a bitcast
    padded_tokens = tiling.round_up(num_tokens, tokens_per_block)
    slots = jnp.pad(slot_mapping, (0, padded_tokens - num_tokens), constant_values=PADDING_SLOT)
    token_spec = pl.BlockSpec((tokens_per_block, kv_heads, head_dim), lambda i, slots_ref: (i, 0, 0))
    hbm_spec = pl.BlockSpec(memory_space=pl.ANY)
    scratch = []
    if quantize:
        slab, scales = (tokens_per_block, kv_heads, head_dim), (tokens_per_block, kv_heads, 1)
        scratch = [pltpu.VMEM(slab, jnp.int8), pltpu.VMEM(slab, jnp.int8),
                   pltpu.VMEM(scales, jnp.float32), pltpu.VMEM(scales, jnp.float32)]
    scratch.append(pltpu.SemaphoreType.DMA((len(caches),)))
    first_cache_input = 3  # operands: slots (scalar prefetch), new_k, new_v, caches...
    call = pl.pallas_call(
        functools.partial(_kv_cache_update_kernel, tokens_per_block=tokens_per_block, quantize=quantize),
        out_shape=[jax.ShapeDtypeStruct(c.shape, c.dtype) for c in flat],
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1,
            grid=(tiling.cdiv(num_tokens, tokens_per_block),),
            in_specs=[token_spec, token_spec] + [hbm_spec] * len(caches),
            out_specs=[hbm_spec] * len(caches),
            scratch_shapes=scratch,
        ),
        input_output_aliases={first_cache_input + c: c for c in range(len(caches))},
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",), vmem_limit_bytes=vmem_limit_bytes),
        cost_estimate=cost_estimate(
            num_tokens=num_tokens, kv_heads=kv_heads, head_dim=head_dim, page_size=k_cache.shape[1],
            new_dtype=new_k.dtype, cache_dtype=k_cache.dtype,
        ),
        interpret=interpret_params(interpret),
        name="kv_cache_update",
    )
    with jax.named_scope(f"kv_cache_update[tokens_per_block={tokens_per_block}]"):
        outs = call(slots, new_k, new_v, *flat)
    return tuple(o.reshape(s) for o, s in zip(outs, shapes))
