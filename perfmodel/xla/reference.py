"""A reference JAX transformer step built from a ModelConfig, for the TPU compiler (weights as shape structs only).

:func:`build_step` returns ``(fn, args, donate_argnums)`` for one decode step
or prefill chunk of :class:`~perfmodel.model.configs.ModelConfig` as
:func:`perfmodel.model.transformer.make_step` describes it, tensor-parallel
over a 1-D mesh ``("tp",)`` of the slice's first ``tp`` chips (Megatron
layout, as the analytic model assumes: heads, MLP and expert widths and the
vocabulary split; KV heads duplicated to ``tp`` when there are fewer; norms
and the router replicated). GSPMD inserts the collectives.

The layers run under ``lax.scan`` (one group per kind: dense, MoE, sliding
window), so the compiled program holds each layer once with its trip count.
Every block runs under a ``jax.named_scope`` named like the analytic op
(``qkv_proj``, ``attention``, ``down``...), which the compiled ops carry in
their metadata; that is how :mod:`perfmodel.xla.compare` pairs them.

Decode attends over a contiguous cache ``[layers, batch, kv_heads, tokens,
head_dim]`` or a paged one ``[layers, kv_heads, pages, page_size, head_dim]``
(``kv_layout``), writing the new token first; prefill writes the chunk after
``context`` cached tokens and attends causally. ``kernels="bundled"`` runs
attention with the bundled Pallas kernels (``kernels/paged_attention`` for
paged decode, ``kernels/flash_attention`` for prefill) under ``shard_map``;
the rest stays jnp. MoE layers route top-k, sort the token copies by expert
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
#: jnp dtype name per perfmodel dtype name.
_JNP = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "fp8": "float8_e4m3fn", "fp8_e5m2": "float8_e5m2",
        "int8": "int8", "int4": "int4"}


@dataclass(frozen=True, kw_only=True)
class LayerGroup:
    """Consecutive-in-kind layers compiled as one scan."""

    layers: int
    #: Sliding window of these layers (None: global attention).
    window: int | None
    #: "dense" or "moe".
    mlp: str
    #: Name of their attention op in the analytic model ("attention", "attention(global)", ...).
    attention_label: str


def layer_groups(cfg: Any) -> list[LayerGroup]:
    from perfmodel.model.transformer import _attention_kinds

    if cfg.mla is not None:
        raise InputError(f"{cfg.name}: the reference step does not build latent attention (MLA) yet; "
                         "compile a model with standard attention")
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

    from perfmodel.model.transformer import shard

    if kv_layout not in KV_LAYOUTS:
        raise InputError(f"`kv_layout` '{kv_layout}': use one of {', '.join(KV_LAYOUTS)}")
    if kernels not in KERNELS:
        raise InputError(f"`kernels` '{kernels}': use one of {', '.join(KERNELS)}")
    if step.context_lens is not None:
        raise InputError("the reference step compiles one shared `context`; `context_lens` / `context_dist` "
                         "are for the analytic model only")
    tp = step.tp
    if tp > len(devices):
        raise InputError(f"`tp` {tp} needs {tp} chips but the `topology` has {len(devices)}; "
                         f"give a larger slice, e.g. --topology with {tp} chips")
    sh = shard(cfg, tp)
    groups = layer_groups(cfg)
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
    glu = "swiglu" if cfg.mlp_activation == "silu" else "geglu"
    vocab_padded = math.ceil(V / tp) * tp

    def spec(shape: tuple[int, ...], dtype: Any, parts: tuple) -> Any:
        return jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, P(*parts)))

    def stacked(n: int, shape: tuple[int, ...], dtype: Any, parts: tuple) -> Any:
        return spec((n, *shape), dtype, (None, *parts))

    def _paged(g: LayerGroup) -> bool:  # sliding-window layers keep a contiguous ring buffer of the window
        return kv_layout == "paged" and step.phase == "decode" and g.window is None

    args: dict[str, Any] = {
        "tokens": spec((B, C), jnp.int32, ()),
        "positions": spec((B,), jnp.int32, ()),
        "embedding": spec((vocab_padded, H), wdt, ("tp", None)),
        "final_norm": spec((H,), act, ()),
        "rng": spec((2,), jnp.uint32, ()),
    }
    if not cfg.tie_embeddings:
        args["lm_head"] = spec((H, vocab_padded), wdt, (None, "tp"))
    if any(_paged(g) for g in groups):
        args["page_table"] = spec((B, pages_per_seq), jnp.int32, ())
    group_args = []
    for g in groups:
        n = g.layers
        w: dict[str, Any] = {
            "attn_norm": stacked(n, (H,), act, (None,)),
            "mlp_norm": stacked(n, (H,), act, (None,)),
            "wq": stacked(n, (H, NQ, D), wdt, (None, "tp", None)),
            "wk": stacked(n, (H, NKV, D), wdt, (None, "tp", None)),
            "wv": stacked(n, (H, NKV, D), wdt, (None, "tp", None)),
            "wo": stacked(n, (NQ, D, H), wdt, ("tp", None, None)),
        }
        if cfg.qk_norm:
            w["q_norm"] = stacked(n, (D,), act, (None,))
            w["k_norm"] = stacked(n, (D,), act, (None,))
        if g.mlp == "dense":
            w["gate_up"] = stacked(n, (H, 2, cfg.intermediate_size), wdt, (None, None, "tp"))
            w["down"] = stacked(n, (cfg.intermediate_size, H), wdt, ("tp", None))
        else:
            moe = cfg.moe
            E, Ie = moe.num_experts, moe.expert_intermediate_size
            w["router"] = stacked(n, (H, E), act, (None, None))
            w["experts_gate_up"] = stacked(n, (E, H, 2 * Ie), wdt, (None, None, "tp"))
            w["experts_down"] = stacked(n, (E, Ie, H), wdt, (None, "tp", None))
            if moe.shared_expert_intermediate_size:
                Is = moe.shared_expert_intermediate_size
                w["shared_gate_up"] = stacked(n, (H, 2, Is), wdt, (None, None, "tp"))
                w["shared_down"] = stacked(n, (Is, H), wdt, ("tp", None))
        cache_tokens = S if g.window is None or step.phase == "prefill" else min(S, g.window)
        if _paged(g):
            pages = B * math.ceil(cache_tokens / page)
            cache = stacked(n, (NKV, pages, page, D), kvdt, ("tp", None, None, None))
        else:
            cache = stacked(n, (B, NKV, cache_tokens, D), kvdt, (None, "tp", None, None))
        w["k_cache"], w["v_cache"] = cache, cache
        group_args.append(w)

    names = list(args)
    flat = [args[k] for k in names]
    for w in group_args:
        flat += list(w.values())
    cache_ids = []
    pos = len(names)
    for w in group_args:
        keys = list(w)
        cache_ids += [pos + keys.index("k_cache"), pos + keys.index("v_cache")]
        pos += len(keys)

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
        return jnp.einsum(eq, x, wt.astype(act), preferred_element_type=jnp.float32).astype(act)

    def act_fn(g: Any) -> Any:
        return jax.nn.silu(g) if cfg.mlp_activation == "silu" else jax.nn.gelu(g, approximate=True)

    def attention_jnp(q: Any, kc: Any, vc: Any, qpos: Any, window: int | None, page_table: Any) -> Any:
        """q [B, C, NQ, D]; kc/vc one layer's cache; qpos [B, C] token positions -> [B, C, NQ, D]."""
        if page_table is not None:  # gather the sequence's pages: [NKV, B, P, page, D] -> [B, NKV, S', D]
            k = jnp.moveaxis(kc[:, page_table], 0, 1).reshape(B, NKV, -1, D)
            v = jnp.moveaxis(vc[:, page_table], 0, 1).reshape(B, NKV, -1, D)
        else:
            k, v = kc, vc
        k, v = k.astype(act), v.astype(act)
        g = NQ // NKV
        qg = q.reshape(B, C, NKV, g, D)
        s = jnp.einsum("bckgd,bksd->bkgcs", qg, k, preferred_element_type=jnp.float32) / math.sqrt(D)
        kpos = jnp.arange(k.shape[2])
        mask = kpos[None, None, :] <= qpos[:, :, None]
        if window is not None:
            mask = mask & (kpos[None, None, :] > qpos[:, :, None] - window)
        s = jnp.where(mask[:, None, None], s, -1e30)
        p = jax.nn.softmax(s, axis=-1).astype(act)
        o = jnp.einsum("bkgcs,bksd->bckgd", p, v, preferred_element_type=jnp.float32)
        return o.reshape(B, C, NQ, D).astype(act)

    def attention_kernels(q: Any, kc: Any, vc: Any, qpos: Any, window: int | None, page_table: Any,
                          positions: Any) -> Any:
        from kernels.flash_attention.kernel import flash_attention
        from kernels.paged_attention.kernel import paged_attention

        chip_name = chip.name if chip is not None else "tpu-v5e"
        if page_table is not None:
            def local(q, kc, vc, pt, lens):
                return paged_attention(q, kc, vc, pt, lens, chip=chip_name)
            out = jax.shard_map(local, mesh=mesh, in_specs=(P(None, "tp", None), P("tp"), P("tp"), P(), P()),
                                out_specs=P(None, "tp", None), check_vma=False)(
                q[:, 0], kc, vc, page_table, positions + 1)
            return out[:, None]

        def local(q, k, v):
            return flash_attention(q, k, v, causal=True, sliding_window=window, chip=chip_name)
        out = jax.shard_map(local, mesh=mesh, in_specs=(P(None, "tp"), P(None, "tp"), P(None, "tp")),
                            out_specs=P(None, "tp"), check_vma=False)(jnp.swapaxes(q, 1, 2), kc.astype(act),
                                                                     vc.astype(act))
        return jnp.swapaxes(out, 1, 2)

    def layer(g: LayerGroup, x: Any, w: dict[str, Any], kc: Any, vc: Any, i: Any, positions: Any,
              page_table: Any) -> tuple:
        """One layer; kc / vc are the group's stacked caches, i the layer."""
        qpos = positions[:, None] + jnp.arange(C)[None, :]  # [B, C]: decode C=1 at `positions`
        with jax.named_scope("attn_norm"):
            h = rms(x, w["attn_norm"])
        with jax.named_scope("qkv_proj"):
            q = mm(h, w["wq"], "th,hnd->tnd")
            k = mm(h, w["wk"], "th,hnd->tnd")
            v = mm(h, w["wv"], "th,hnd->tnd")
        if cfg.qk_norm:
            with jax.named_scope("qk_norm"):
                q, k = rms(q, w["q_norm"]), rms(k, w["k_norm"])
        if cfg.rope_theta:
            with jax.named_scope("rope"):
                flat_pos = qpos.reshape(T)
                q, k = rope(q, flat_pos), rope(k, flat_pos)
        with jax.named_scope("kv_write"):  # into the stacked cache of the group, at layer i (in place)
            kn, vn = k.astype(kvdt).reshape(B, C, NKV, D), v.astype(kvdt).reshape(B, C, NKV, D)
            if page_table is not None:  # decode: one row per sequence at its slot
                slot_page = page_table[jnp.arange(B), positions // page]
                kc = kc.at[i, :, slot_page, positions % page].set(kn[:, 0])
                vc = vc.at[i, :, slot_page, positions % page].set(vn[:, 0])
            elif step.phase == "decode":
                slot = positions % kc.shape[3]
                kc = kc.at[i, jnp.arange(B), :, slot].set(kn[:, 0])
                vc = vc.at[i, jnp.arange(B), :, slot].set(vn[:, 0])
            else:  # prefill: the chunk after `context` cached tokens
                start = step.context_tokens
                kc = jax.lax.dynamic_update_slice(kc, jnp.swapaxes(kn, 1, 2)[None], (i, 0, 0, start, 0))
                vc = jax.lax.dynamic_update_slice(vc, jnp.swapaxes(vn, 1, 2)[None], (i, 0, 0, start, 0))
        with jax.named_scope(g.attention_label):
            qb = q.reshape(B, C, NQ, D)
            if kernels == "bundled":
                o = attention_kernels(qb, kc[i], vc[i], qpos, g.window, page_table, positions)
            else:
                o = attention_jnp(qb, kc[i], vc[i], qpos if g.window is None or step.phase == "prefill"
                                  else jnp.minimum(qpos, kc.shape[3] - 1), g.window, page_table)
        with jax.named_scope("o_proj"):
            x = x + mm(o.reshape(T, NQ, D), w["wo"], "tnd,ndh->th")
        with jax.named_scope("mlp_norm"):
            h = rms(x, w["mlp_norm"])
        if g.mlp == "dense":
            with jax.named_scope("gate_up"):
                gu = jnp.einsum("th,hgi->tgi", h, w["gate_up"].astype(act), preferred_element_type=jnp.float32)
            with jax.named_scope(glu):
                a = (act_fn(gu[:, 0]) * gu[:, 1]).astype(act)
            with jax.named_scope("down"):
                x = x + mm(a, w["down"], "ti,ih->th")
            return x, kc, vc
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
            gu = jax.lax.ragged_dot(xs, w["experts_gate_up"].astype(act), sizes)
        with jax.named_scope(f"experts_{glu}"):
            half = gu.shape[-1] // 2
            a = (act_fn(gu[:, :half].astype(jnp.float32)) * gu[:, half:]).astype(act)
        with jax.named_scope("experts_down"):
            y = jax.lax.ragged_dot(a, w["experts_down"].astype(act), sizes)
        if "shared_gate_up" in w:
            with jax.named_scope("shared_gate_up"):
                sg = jnp.einsum("th,hgi->tgi", h, w["shared_gate_up"].astype(act),
                                preferred_element_type=jnp.float32)
            with jax.named_scope(f"shared_{glu}"):
                sa = (act_fn(sg[:, 0]) * sg[:, 1]).astype(act)
            with jax.named_scope("shared_down"):
                x = x + mm(sa, w["shared_down"], "ti,ih->th")
        with jax.named_scope("combine"):
            back = jnp.zeros_like(y).at[order].set(y).reshape(T, K, H)
            x = x + jnp.einsum("tkh,tk->th", back, weights.astype(act), preferred_element_type=jnp.float32
                               ).astype(act)
        return x, kc, vc

    def step_fn(*flat_args: Any) -> Any:
        a = dict(zip(names, flat_args[:len(names)]))
        rest = list(flat_args[len(names):])
        positions = a["positions"]
        page_table = a.get("page_table")
        with jax.named_scope("embed"):
            x = jnp.take(a["embedding"], a["tokens"].reshape(T), axis=0).astype(act)
        caches = []
        for g, w_struct in zip(groups, group_args):
            keys = list(w_struct)
            w_vals = dict(zip(keys, rest[:len(keys)]))
            rest = rest[len(keys):]
            kc_all, vc_all = w_vals.pop("k_cache"), w_vals.pop("v_cache")

            def body(carry: Any, i: Any, g: LayerGroup = g, w_vals: dict = w_vals) -> Any:
                x, kc_all, vc_all = carry
                w = {k: v[i] for k, v in w_vals.items()}
                x, kc_all, vc_all = layer(g, x, w, kc_all, vc_all, i, positions,
                                          page_table if _paged(g) else None)
                return (x, kc_all, vc_all), None

            (x, kc_all, vc_all), _ = jax.lax.scan(body, (x, kc_all, vc_all), jnp.arange(g.layers))
            caches += [kc_all, vc_all]
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
