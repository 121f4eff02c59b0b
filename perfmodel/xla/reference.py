"""A reference JAX transformer step built from a ModelConfig, for the TPU compiler (weights as shape structs only).

:func:`build_step` returns ``(fn, args, donate_argnums)`` for one decode step
or prefill chunk of :class:`~perfmodel.model.schema.ModelConfig` as
:func:`perfmodel.model.step.make_step` describes it, tensor-parallel
over a 1-D mesh ``("tp",)`` of the slice's first ``tp`` chips (Megatron
layout, as the analytic model assumes: heads, MLP and expert widths and the
vocabulary split; KV heads duplicated to ``tp`` when there are fewer; norms
and the router replicated). GSPMD inserts the collectives.

The step is laid out as a serving engine runs it: every layer has its own
weight and KV-cache arrays (no stacked ``[layers, ...]`` arrays, which XLA
slices and re-lays out per layer) and the layers are unrolled in Python.
Every block runs under a ``jax.named_scope`` named like the analytic op
(``qkv_proj``, ``attention``, ``down``...), which the compiled ops carry in
their metadata; that is how :mod:`perfmodel.xla.compare` pairs them.

MLP: gated (``mlp_gated``) is ``act(x W_gate) * (x W_up)`` then ``W_down``
(gate and up separate arrays, each split over ``tp``); non-gated is
``act(x W_up)`` then ``W_down``; ``mlp_bias`` adds the biases. Activations
silu, gelu_tanh, gelu (erf) and relu.

Decode attends over a contiguous cache ``[batch, kv_heads, tokens, head_dim]``
(K and V apart) or a paged one (``kv_layout``), writing the new token first.
The jnp paged cache is head-major, ``[kv_heads, pages, 2, page_size,
head_dim]`` (a page of one head holds its K rows, then its V rows): a block's
gather copies whole 2 x page_size x head_dim slabs straight into the layout
the attention matmuls read (token-major pages cost a VMEM relayout per block,
4 kB per-head K and V slabs a bundle-bound gather: both measured on v6e). With
``kernels="bundled"`` it is ``ragged_paged_attention``'s combined
``[pages, page_size, 2 * kv_heads, head_dim]``, K of head h at row 2h, V at
2h + 1. Paged decode in jnp reads the pages a block at
a time (at most :data:`PAGED_BLOCK_TOKENS` tokens per sequence and
:data:`PAGED_BLOCK_BYTES` over the batch, so that the gathered block stays in
VMEM) with an online softmax, so no whole-context copy of the cache is made. Prefill writes the chunk after
``context`` cached tokens and attends causally. ``kernels="bundled"`` runs
attention with the bundled Pallas kernels (``kernels/ragged_paged_attention``
for paged decode, one query token per sequence, and
``kernels/kv_cache_update``'s combined layout for its cache write;
``kernels/flash_attention`` for prefill) under ``shard_map``; the rest stays
jnp. MoE layers route top-k, sort the token copies by expert
and run ``lax.ragged_dot``. Weight quantization is modelled by storing the
weights in ``weight_dtype`` and converting them before each matmul (scales
are not modelled). MLA models (DeepSeek-V3) are not built.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

from perfmodel.errors import InputError

KV_LAYOUTS = ("paged", "contiguous")
KERNELS = ("jnp", "bundled")
#: Most tokens of KV a jnp paged-decode attention reads per sequence per block (whole pages; online softmax
#: across blocks).
PAGED_BLOCK_TOKENS = 512
#: Most bytes of K (and as many of V) one block gathers over the whole batch on one chip: XLA materializes a
#: gather that does not fit in VMEM in HBM and copies it back (3x the cache's bytes: seen on v6e at batch 64 with
#: 67 MB blocks), so the block shrinks with the batch to stay in VMEM.
PAGED_BLOCK_BYTES = 4 * 2**20
#: Activations the reference step builds (ModelConfig.mlp_activation).
ACTIVATIONS = ("silu", "gelu_tanh", "gelu", "relu")
#: jnp dtype name per perfmodel dtype name.
_JNP = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "fp8": "float8_e4m3fn", "fp8_e5m2": "float8_e5m2",
        "int8": "int8", "int4": "int4"}


@dataclass(frozen=True, kw_only=True)
class LayerGroup:
    """Consecutive-in-kind layers (the same attention and MLP)."""

    layers: int
    #: Sliding window of these layers (None: global attention).
    window: int | None
    #: "dense" or "moe".
    mlp: str
    #: Name of their attention op in the analytic model ("attention", "attention(global)", ...).
    attention_label: str


def layer_groups(cfg: Any) -> list[LayerGroup]:
    """The layer kinds of cfg; InputError naming the config field the reference step cannot build."""
    from perfmodel.model.transformer import _attention_kinds

    if cfg.mla is not None:
        raise InputError(f"{cfg.name}: the reference step does not build latent attention (MLA, field `mla`) yet; "
                         "compile a model with standard attention")
    if cfg.mlp_activation not in ACTIVATIONS:
        raise InputError(f"{cfg.name}: `mlp_activation` '{cfg.mlp_activation}' is not built by the reference step; "
                         f"use one of {', '.join(ACTIVATIONS)}")
    if cfg.moe is not None and (not cfg.mlp_gated or cfg.mlp_bias):
        field = "mlp_gated" if not cfg.mlp_gated else "mlp_bias"
        raise InputError(f"{cfg.name}: `{field}` {getattr(cfg, field)} with MoE layers is not built by the reference "
                         "step (its experts are gated, without biases)")
    kinds = _attention_kinds(cfg)
    if cfg.moe is not None and len(kinds) > 1:
        raise InputError(f"{cfg.name}: a MoE model with sliding-window layers is not built by the reference step")
    groups = []
    if cfg.moe is not None:
        if cfg.num_dense_layers:
            groups.append(LayerGroup(layers=cfg.num_dense_layers, window=None, mlp="dense",
                                     attention_label=kinds[0][0]))
        groups.append(LayerGroup(layers=cfg.moe.num_moe_layers, window=None, mlp="moe", attention_label=kinds[0][0]))
        return groups
    return [LayerGroup(layers=n, window=w, mlp="dense", attention_label=label) for label, n, w in kinds]


def _dtype(name: str) -> Any:
    import jax.numpy as jnp

    return jnp.dtype(_JNP.get(name, name))


def build_step(cfg: Any, step: Any, devices: list[Any], *, kv_layout: str = "paged", kernels: str = "jnp",
               chip: Any = None) -> tuple[Callable, list[Any], tuple[int, ...]]:
    """(function, abstract sharded arguments, donated argument numbers) of one step (see the module docstring)."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    from perfmodel.model.sharding import shard
    from perfmodel.model.transformer import GLU_KIND

    if kv_layout not in KV_LAYOUTS:
        raise InputError(f"`kv_layout` '{kv_layout}': use one of {', '.join(KV_LAYOUTS)}")
    if kernels not in KERNELS:
        raise InputError(f"`kernels` '{kernels}': use one of {', '.join(KERNELS)}")
    if kernels == "bundled" and step.phase == "decode" and kv_layout != "paged":
        raise InputError("`kernels` bundled: decode over a contiguous KV cache has no bundled kernel; "
                         "use --kv-layout paged (or --kernels jnp)")
    if kernels == "bundled" and step.kv_dtype != step.act_dtype:
        raise InputError(f"`kernels` bundled with `kv_dtype` {step.kv_dtype}: the reference step does not build "
                         "the per-page scales the bundled attention kernels need; use --kernels jnp")
    if step.context_lens is not None:
        raise InputError("the reference step compiles one shared `context`; `context_lens` / `context_dist` "
                         "are for the analytic model only")
    if kernels == "bundled" and step.phase == "decode" and cfg.head_dim % 128 and cfg.head_dim != 64:
        raise InputError(f"`kernels` bundled: ragged_paged_attention needs `head_dim` 64 or a multiple of 128 "
                         f"({cfg.name} has {cfg.head_dim}); use --kernels jnp")
    tp = step.tp
    if tp > len(devices):
        raise InputError(f"`tp` {tp} needs {tp} chips but the `topology` has {len(devices)}; "
                         f"give a larger slice, e.g. --topology with {tp} chips")
    shard(cfg, tp)  # the analytic model's checks of the split (heads, widths divisible by tp)
    groups = layer_groups(cfg)
    layers = [g for g in groups for _ in range(g.layers)]
    mesh = Mesh(np.array(devices[:tp]), ("tp",))
    act, wdt, kvdt = _dtype(step.act_dtype), _dtype(step.weight_dtype), _dtype(step.kv_dtype)
    H, D, V = cfg.hidden_size, cfg.head_dim, cfg.vocab_size
    NQ = cfg.num_q_heads
    NKV = max(cfg.num_kv_heads, tp)  # duplicated to one per chip when there are fewer than tp
    B, C = step.batch, step.chunk_tokens
    T = B * C
    S = step.kv_tokens  # cache tokens per sequence after the step
    page = step.page_size
    pages_per_seq = math.ceil(S / page)
    glu = GLU_KIND.get(cfg.mlp_activation) if cfg.mlp_gated else None
    mlp_in = "gate_up" if cfg.mlp_gated else "up"
    vocab_padded = math.ceil(V / tp) * tp

    def spec(shape: tuple[int, ...], dtype: Any, parts: tuple) -> Any:
        return jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, P(*parts)))

    def paged(g: LayerGroup) -> bool:  # sliding-window layers keep a contiguous ring buffer of the window
        return kv_layout == "paged" and step.phase == "decode" and g.window is None

    def mlp_weights(prefix: str, width: int, gated: bool, bias: bool) -> dict[str, Any]:
        w = {f"{prefix}up": spec((H, width), wdt, (None, "tp")), f"{prefix}down": spec((width, H), wdt, ("tp", None))}
        if gated:
            w[f"{prefix}gate"] = spec((H, width), wdt, (None, "tp"))
        if bias:
            w[f"{prefix}up_bias"] = spec((width,), act, ("tp",))
            w[f"{prefix}down_bias"] = spec((H,), act, ())
            if gated:
                w[f"{prefix}gate_bias"] = spec((width,), act, ("tp",))
        return w

    args: dict[str, Any] = {
        "tokens": spec((B, C), jnp.int32, ()),
        "positions": spec((B,), jnp.int32, ()),
        "embedding": spec((vocab_padded, H), wdt, ("tp", None)),
        "final_norm": spec((H,), act, ()),
        "rng": spec((2,), jnp.uint32, ()),
    }
    if not cfg.tie_embeddings:
        args["lm_head"] = spec((H, vocab_padded), wdt, (None, "tp"))
    if any(paged(g) for g in groups):
        args["page_table"] = spec((B, pages_per_seq), jnp.int32, ())
    layer_args: list[dict[str, Any]] = []
    for g in layers:
        w: dict[str, Any] = {
            "attn_norm": spec((H,), act, ()),
            "mlp_norm": spec((H,), act, ()),
            "wq": spec((H, NQ, D), wdt, (None, "tp", None)),
            "wk": spec((H, NKV, D), wdt, (None, "tp", None)),
            "wv": spec((H, NKV, D), wdt, (None, "tp", None)),
            "wo": spec((NQ, D, H), wdt, ("tp", None, None)),
        }
        if cfg.qk_norm:
            w["q_norm"] = spec((D,), act, ())
            w["k_norm"] = spec((D,), act, ())
        if g.mlp == "dense":
            w.update(mlp_weights("", cfg.intermediate_size, cfg.mlp_gated, cfg.mlp_bias))
        else:
            moe = cfg.moe
            E, Ie = moe.num_experts, moe.expert_intermediate_size
            w["router"] = spec((H, E), act, ())
            w["experts_gate"] = spec((E, H, Ie), wdt, (None, None, "tp"))
            w["experts_up"] = spec((E, H, Ie), wdt, (None, None, "tp"))
            w["experts_down"] = spec((E, Ie, H), wdt, (None, "tp", None))
            if moe.shared_expert_intermediate_size:
                w.update(mlp_weights("shared_", moe.shared_expert_intermediate_size, True, False))
        cache_tokens = S if g.window is None or step.phase == "prefill" else min(S, g.window)
        if paged(g) and kernels == "bundled":  # ragged_paged_attention's layout
            w["kv_cache"] = spec((B * math.ceil(cache_tokens / page), page, 2 * NKV, D), kvdt,
                                 (None, None, "tp", None))
        elif paged(g):  # head-major: a page of one head holds its K rows, then its V rows
            w["kv_cache"] = spec((NKV, B * math.ceil(cache_tokens / page), 2, page, D), kvdt,
                                 ("tp", None, None, None, None))
        else:
            cache = spec((B, NKV, cache_tokens, D), kvdt, (None, "tp", None, None))
            w["k_cache"], w["v_cache"] = cache, cache
        layer_args.append(w)

    names = list(args)
    flat = [args[k] for k in names]
    cache_ids = []
    for w in layer_args:
        cache_ids += [len(flat) + i for i, k in enumerate(w) if k.endswith("_cache")]
        flat += list(w.values())

    def rms(x: Any, weight: Any) -> Any:
        xf = x.astype(jnp.float32)
        y = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + 1e-6)
        return (y * weight.astype(jnp.float32)).astype(act)

    def rope(x: Any, positions: Any) -> Any:  # x [T, heads, D], positions [T]
        half = D // 2
        freq = 1.0 / (float(cfg.rope_theta or 10000.0) ** (jnp.arange(half, dtype=jnp.float32) / half))
        ang = positions.astype(jnp.float32)[:, None] * freq[None, :]
        cos, sin = jnp.cos(ang)[:, None, :], jnp.sin(ang)[:, None, :]
        xf = x.astype(jnp.float32)
        a, b = xf[..., :half], xf[..., half:]
        return jnp.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1).astype(act)

    def mm(x: Any, wt: Any, eq: str) -> Any:
        return jnp.einsum(eq, x, wt.astype(act), preferred_element_type=jnp.float32)

    def act_fn(x: Any) -> Any:
        if cfg.mlp_activation == "silu":
            return jax.nn.silu(x)
        if cfg.mlp_activation == "relu":
            return jax.nn.relu(x)
        return jax.nn.gelu(x, approximate=cfg.mlp_activation == "gelu_tanh")

    def mlp(h: Any, w: dict[str, Any], prefix: str, gated: bool) -> Any:
        """[T, H] -> [T, H] (f32): the input projection(s), the activation (a GLU when gated), down."""
        def proj(name: str) -> Any:
            y = mm(h, w[f"{prefix}{name}"], "th,hi->ti")
            b = w.get(f"{prefix}{name}_bias")
            return y if b is None else y + b.astype(jnp.float32)

        with jax.named_scope(prefix + ("gate_up" if gated else "up")):
            if gated:
                g, u = proj("gate"), proj("up")
            else:
                a = act_fn(proj("up")).astype(act)  # the activation is the up projection's epilogue
        if gated:
            with jax.named_scope(prefix + glu):
                a = (act_fn(g) * u).astype(act)
        with jax.named_scope(prefix + "down"):
            y = mm(a, w[f"{prefix}down"], "ti,ih->th")
            b = w.get(f"{prefix}down_bias")
            return y if b is None else y + b.astype(jnp.float32)

    def attention_dense(q: Any, k: Any, v: Any, qpos: Any, window: int | None) -> Any:
        """q [B, C, NQ, D]; k/v [B, NKV, S', D]; qpos [B, C] token positions -> [B, C, NQ, D]."""
        g = NQ // NKV
        qg = q.reshape(B, C, NKV, g, D)
        s = jnp.einsum("bckgd,bksd->bkgcs", qg, k.astype(act), preferred_element_type=jnp.float32) / math.sqrt(D)
        kpos = jnp.arange(k.shape[2])
        mask = kpos[None, None, :] <= qpos[:, :, None]
        if window is not None:
            mask = mask & (kpos[None, None, :] > qpos[:, :, None] - window)
        s = jnp.where(mask[:, None, None], s, -1e30)
        p = jax.nn.softmax(s, axis=-1).astype(act)
        o = jnp.einsum("bkgcs,bksd->bckgd", p, v.astype(act), preferred_element_type=jnp.float32)
        return o.reshape(B, C, NQ, D).astype(act)

    def attention_paged(q: Any, kv: Any, page_table: Any, lengths: Any) -> Any:
        """Decode: q [B, 1, NQ, D] over the pages of each sequence (combined cache [pages, page, 2 NKV, D]), a
        block of pages at a time (online softmax; no whole-context gather) -> [B, 1, NQ, D]."""
        g = NQ // NKV
        token_bytes = B * (NKV // tp) * D * kvdt.itemsize  # one token of K over the batch, one chip's heads
        per = max(1, min(pages_per_seq, PAGED_BLOCK_TOKENS // page, PAGED_BLOCK_BYTES // (token_bytes * page)))
        blocks = math.ceil(pages_per_seq / per)
        pt = jnp.pad(page_table, ((0, 0), (0, blocks * per - pages_per_seq)))
        qg = q.reshape(B, NKV, g, D).astype(jnp.float32) / math.sqrt(D)

        def body(j: Any, carry: tuple) -> tuple:
            m, l, acc = carry
            ids = jax.lax.dynamic_slice_in_dim(pt, j * per, per, axis=1)  # [B, per]
            blk = kv[:, ids].astype(act)  # [NKV, B, per, 2, page, D]: this block's pages only
            k = blk[:, :, :, 0].reshape(NKV, B, per * page, D)
            v = blk[:, :, :, 1].reshape(NKV, B, per * page, D)
            s = jnp.einsum("bkgd,kbsd->bkgs", qg.astype(act), k, preferred_element_type=jnp.float32)
            kpos = j * per * page + jnp.arange(per * page)
            s = jnp.where(kpos[None, None, None, :] < lengths[:, None, None, None], s, -1e30)
            m_new = jnp.maximum(m, s.max(axis=-1))
            p = jnp.exp(s - m_new[..., None])
            scale = jnp.exp(m - m_new)
            l = l * scale + p.sum(axis=-1)
            acc = acc * scale[..., None] + jnp.einsum("bkgs,kbsd->bkgd", p.astype(act), v,
                                                      preferred_element_type=jnp.float32)
            return m_new, l, acc

        init = (jnp.full((B, NKV, g), -1e30, jnp.float32), jnp.zeros((B, NKV, g), jnp.float32),
                jnp.zeros((B, NKV, g, D), jnp.float32))
        _, l, acc = jax.lax.fori_loop(0, blocks, body, init)
        return (acc / l[..., None]).reshape(B, 1, NQ, D).astype(act)

    chip_name = chip.name if chip is not None else "tpu-v5e"

    def attention_kernels(q: Any, kc: Any, vc: Any, window: int | None, page_table: Any, lengths: Any) -> Any:
        """Bundled attention: ragged paged attention over the combined cache ``kc`` (``vc`` None) with one query
        token per sequence, or flash attention over the prefill chunk."""
        from kernels.flash_attention.kernel import flash_attention
        from kernels.ragged_paged_attention.kernel import ragged_paged_attention

        if page_table is not None:
            def local_paged(q: Any, kv: Any, pt: Any, lens: Any) -> Any:
                return ragged_paged_attention(q, kv, lens, pt, jnp.arange(B + 1, dtype=jnp.int32), B,
                                              chip=chip_name)
            out = jax.shard_map(local_paged, mesh=mesh, in_specs=(P(None, "tp", None), P(None, None, "tp", None),
                                                                  P(), P()),
                                out_specs=P(None, "tp", None), check_vma=False)(q[:, 0], kc, page_table, lengths)
            return out[:, None]

        def local_flash(q: Any, k: Any, v: Any) -> Any:
            return flash_attention(q, k, v, causal=True, sliding_window=window, chip=chip_name)
        out = jax.shard_map(local_flash, mesh=mesh, in_specs=(P(None, "tp"), P(None, "tp"), P(None, "tp")),
                            out_specs=P(None, "tp"), check_vma=False)(jnp.swapaxes(q, 1, 2), kc.astype(act),
                                                                     vc.astype(act))
        return jnp.swapaxes(out, 1, 2)

    def write_pages(kv: Any, kn: Any, vn: Any, page_table: Any, positions: Any) -> Any:
        """Each sequence's new K/V row [2 NKV, D] (K of head h at 2h, V at 2h + 1) into its slot of the combined
        cache, in place (donated)."""
        slot_page = page_table[jnp.arange(B), positions // page]
        if kernels == "bundled":
            from kernels.kv_cache_update.kernel import kv_pages_update

            slots = slot_page * page + positions % page
            return jax.shard_map(lambda k, v, c, sl: kv_pages_update(k, v, c, sl, chip=chip_name), mesh=mesh,
                                 in_specs=(P(None, "tp", None), P(None, "tp", None), P(None, None, "tp", None), P()),
                                 out_specs=P(None, None, "tp", None), check_vma=False)(kn, vn, kv, slots)
        return kv.at[:, slot_page, :, positions % page].set(jnp.stack([kn, vn], axis=2))  # rows [B, NKV, 2, D]

    def layer(g: LayerGroup, x: Any, w: dict[str, Any], positions: Any, page_table: Any) -> tuple:
        """One layer -> (x, its caches: the combined paged one, or k and v)."""
        kc, vc = w.get("kv_cache", w.get("k_cache")), w.get("v_cache")
        qpos = positions[:, None] + jnp.arange(C)[None, :]  # [B, C]: decode C=1 at `positions`
        with jax.named_scope("attn_norm"):
            h = rms(x, w["attn_norm"])
        with jax.named_scope("qkv_proj"):
            q = mm(h, w["wq"], "th,hnd->tnd").astype(act)
            k = mm(h, w["wk"], "th,hnd->tnd").astype(act)
            v = mm(h, w["wv"], "th,hnd->tnd").astype(act)
        if cfg.qk_norm:
            with jax.named_scope("qk_norm"):
                q, k = rms(q, w["q_norm"]), rms(k, w["k_norm"])
        if cfg.rope_theta:
            with jax.named_scope("rope"):
                flat_pos = qpos.reshape(T)
                q, k = rope(q, flat_pos), rope(k, flat_pos)
        with jax.named_scope("kv_write"):  # in place (the caches are donated)
            kn, vn = k.astype(kvdt).reshape(B, C, NKV, D), v.astype(kvdt).reshape(B, C, NKV, D)
            if page_table is not None:  # decode: one row per sequence at its slot
                kc = write_pages(kc, kn[:, 0], vn[:, 0], page_table, positions)
            elif step.phase == "decode":
                slot = positions % kc.shape[2]
                kc = kc.at[jnp.arange(B), :, slot].set(kn[:, 0])
                vc = vc.at[jnp.arange(B), :, slot].set(vn[:, 0])
            else:  # prefill: the chunk after `context` cached tokens
                start = step.context_tokens
                kc = jax.lax.dynamic_update_slice(kc, jnp.swapaxes(kn, 1, 2), (0, 0, start, 0))
                vc = jax.lax.dynamic_update_slice(vc, jnp.swapaxes(vn, 1, 2), (0, 0, start, 0))
        with jax.named_scope(g.attention_label):
            qb = q.reshape(B, C, NQ, D)
            if kernels == "bundled":
                o = attention_kernels(qb, kc, vc, g.window, page_table, positions + 1)
            elif page_table is not None:
                o = attention_paged(qb, kc, page_table, positions + 1)
            else:
                o = attention_dense(qb, kc, vc, qpos if g.window is None or step.phase == "prefill"
                                    else jnp.minimum(qpos, kc.shape[2] - 1), g.window)
        with jax.named_scope("o_proj"):
            x = x + mm(o.reshape(T, NQ, D), w["wo"], "tnd,ndh->th").astype(act)
        with jax.named_scope("mlp_norm"):
            h = rms(x, w["mlp_norm"])
        if g.mlp == "dense":
            return x + mlp(h, w, "", cfg.mlp_gated).astype(act), [c for c in (kc, vc) if c is not None]
        moe = cfg.moe
        E, K = moe.num_experts, moe.experts_per_token
        with jax.named_scope("router+topk"):
            logits = jnp.einsum("th,he->te", h, w["router"], preferred_element_type=jnp.float32)
            weights, idx = jax.lax.top_k(jax.nn.softmax(logits, axis=-1), K)
        with jax.named_scope("dispatch"):
            flat_idx = idx.reshape(-1)
            order = jnp.argsort(flat_idx)
            xs = jnp.repeat(h, K, axis=0)[order]
            sizes = jnp.bincount(flat_idx, length=E).astype(jnp.int32)
        with jax.named_scope("experts_gate_up"):
            eg = jax.lax.ragged_dot(xs, w["experts_gate"].astype(act), sizes, preferred_element_type=jnp.float32)
            eu = jax.lax.ragged_dot(xs, w["experts_up"].astype(act), sizes, preferred_element_type=jnp.float32)
        with jax.named_scope(f"experts_{glu}"):
            a = (act_fn(eg) * eu).astype(act)
        with jax.named_scope("experts_down"):
            y = jax.lax.ragged_dot(a, w["experts_down"].astype(act), sizes)
        if "shared_up" in w:
            x = x + mlp(h, w, "shared_", True).astype(act)
        with jax.named_scope("combine"):
            back = jnp.zeros_like(y).at[order].set(y).reshape(T, K, H)
            x = x + jnp.einsum("tkh,tk->th", back, weights.astype(act), preferred_element_type=jnp.float32
                               ).astype(act)
        return x, [c for c in (kc, vc) if c is not None]

    def step_fn(*flat_args: Any) -> Any:
        a = dict(zip(names, flat_args[:len(names)]))
        rest = list(flat_args[len(names):])
        positions = a["positions"]
        page_table = a.get("page_table")
        with jax.named_scope("embed"):
            x = jnp.take(a["embedding"], a["tokens"].reshape(T), axis=0).astype(act)
        caches = []
        for g, w_struct in zip(layers, layer_args):
            w = dict(zip(w_struct, rest[:len(w_struct)]))
            rest = rest[len(w_struct):]
            x, layer_caches = layer(g, x, w, positions, page_table if paged(g) else None)
            caches += layer_caches
        with jax.named_scope("final_norm"):
            x = rms(x, a["final_norm"])
        with jax.named_scope("lm_head"):
            last = x.reshape(B, C, H)[:, -1]
            head = a["lm_head"] if "lm_head" in a else a["embedding"].T
            logits = jnp.einsum("bh,hv->bv", last, head.astype(act), preferred_element_type=jnp.float32)
        with jax.named_scope("sampling"):
            key = jax.random.wrap_key_data(a["rng"])
            tokens = jax.random.categorical(key, logits[:, :V] / 0.7, axis=-1)
        return tokens, *caches

    return step_fn, flat, tuple(cache_ids)
