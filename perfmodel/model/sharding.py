"""One chip's share of a model under tensor parallelism: widths, weight matrices, weight and KV bytes, HBM fit.

Tensor parallelism (``tp`` chips over ICI) follows the Megatron layout: heads,
MLP and expert widths and the vocabulary are split, KV heads are replicated when
there are fewer than ``tp``, the router and MLA's down projections are
replicated. :func:`weight_matrices` lists every weight matrix as one chip holds
it; the step's GEMMs (:mod:`perfmodel.model.transformer`) and the HBM footprint
(:func:`memory_fit`) both use these shapes.

No jax import here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from perfmodel.errors import InputError
from perfmodel.model import kvcache
from perfmodel.model.dtypes import DTYPES, SCALE_BYTES, default_kv_scale, is_quantized
from perfmodel.model.schema import ModelConfig
from perfmodel.model.step import Step

# --------------------------------------------------------------------------- sharding


@dataclass(frozen=True, kw_only=True)
class Shard:
    """Per-chip widths under tensor parallelism."""

    tp: int
    q_heads: int
    kv_heads: int
    #: Chips holding a copy of each KV head (1 unless tp > kv heads).
    kv_replicas: int
    intermediate: int
    expert_intermediate: int
    shared_intermediate: int
    vocab: int


def shard(cfg: ModelConfig, tp: int) -> Shard:
    """Split cfg over tp chips; InputError when the heads do not split evenly."""
    if cfg.num_q_heads % tp:
        raise InputError(f"`tp` {tp} must divide {cfg.name}'s {cfg.num_q_heads} query heads")
    kv = cfg.num_kv_heads
    if cfg.mla is None and kv % tp and tp % kv:
        raise InputError(f"`tp` {tp}: {cfg.name}'s {kv} KV heads neither split over nor replicate evenly onto "
                         f"{tp} chips; use a divisor or multiple of {kv}")
    moe = cfg.moe
    return Shard(
        tp=tp,
        q_heads=cfg.num_q_heads // tp,
        kv_heads=max(kv // tp, 1),
        kv_replicas=max(tp // kv, 1),
        intermediate=math.ceil((cfg.intermediate_size or 0) / tp),
        expert_intermediate=math.ceil(moe.expert_intermediate_size / tp) if moe else 0,
        shared_intermediate=math.ceil((moe.shared_expert_intermediate_size or 0) / tp) if moe else 0,
        vocab=math.ceil(cfg.vocab_size / tp),
    )


# --------------------------------------------------------------------------- weights


@dataclass(frozen=True, kw_only=True)
class Matrix:
    """One weight matrix [k, n] as one chip holds it, ``copies`` of it per layer (experts), in ``layers`` layers."""

    name: str
    k: int
    n: int
    layers: int
    copies: int = 1
    #: Kept in the activation dtype whatever the weight dtype (routers).
    high_precision: bool = False


def weight_matrices(cfg: ModelConfig, sh: Shard) -> list[Matrix]:
    """Every weight matrix of the model, per chip. The GEMM ops and the HBM footprint both use these shapes."""
    h, layers = cfg.hidden_size, cfg.num_layers
    out: list[Matrix] = []
    if cfg.mla is None:
        out.append(Matrix(name="qkv_proj", k=h, n=(sh.q_heads + 2 * sh.kv_heads) * cfg.head_dim, layers=layers))
        out.append(Matrix(name="o_proj", k=sh.q_heads * cfg.head_dim, n=h, layers=layers))
    else:
        m = cfg.mla
        latent = m.kv_lora_rank + m.qk_rope_head_dim
        if m.q_lora_rank is None:
            out.append(Matrix(name="q_proj", k=h, n=sh.q_heads * cfg.head_dim, layers=layers))
            out.append(Matrix(name="kv_down", k=h, n=latent, layers=layers))
        else:
            out.append(Matrix(name="qkv_down", k=h, n=m.q_lora_rank + latent, layers=layers))
            out.append(Matrix(name="q_up", k=m.q_lora_rank, n=sh.q_heads * cfg.head_dim, layers=layers))
        out.append(Matrix(name="kv_up", k=m.kv_lora_rank, n=sh.q_heads * (m.qk_nope_head_dim + m.v_head_dim),
                          layers=layers))
        out.append(Matrix(name="o_proj", k=sh.q_heads * m.v_head_dim, n=h, layers=layers))
    if cfg.num_dense_layers:  # gated: gate and up side by side; non-gated: up only
        out.append(Matrix(name=mlp_input_name(cfg), k=h, n=(2 if cfg.mlp_gated else 1) * sh.intermediate,
                          layers=cfg.num_dense_layers))
        out.append(Matrix(name="down", k=sh.intermediate, n=h, layers=cfg.num_dense_layers))
    if cfg.moe is not None:
        moe, nm = cfg.moe, cfg.moe.num_moe_layers
        out.append(Matrix(name="router", k=h, n=moe.num_experts, layers=nm, high_precision=True))
        out.append(Matrix(name="experts_gate_up", k=h, n=2 * sh.expert_intermediate, layers=nm,
                          copies=moe.num_experts))
        out.append(Matrix(name="experts_down", k=sh.expert_intermediate, n=h, layers=nm, copies=moe.num_experts))
        if sh.shared_intermediate:
            out.append(Matrix(name="shared_gate_up", k=h, n=2 * sh.shared_intermediate, layers=nm))
            out.append(Matrix(name="shared_down", k=sh.shared_intermediate, n=h, layers=nm))
    out.append(Matrix(name="embedding", k=sh.vocab, n=h, layers=1))
    if not cfg.tie_embeddings:
        out.append(Matrix(name="lm_head", k=h, n=sh.vocab, layers=1))
    return out


def mlp_input_name(cfg: ModelConfig) -> str:
    """Name of the dense MLP's input projection: "gate_up" (gated) or "up"."""
    return "gate_up" if cfg.mlp_gated else "up"


def matrix_bytes(mat: Matrix, weight_dtype: str, act_dtype: str) -> float:
    """Bytes of one copy of mat: elements x itemsize, plus f32 per-channel scales when quantized."""
    dt = act_dtype if mat.high_precision else weight_dtype
    scales = mat.n * SCALE_BYTES if is_quantized(dt) else 0
    return mat.k * mat.n * DTYPES[dt].itemsize_bytes + scales


def weight_bytes_per_chip(cfg: ModelConfig, sh: Shard, weight_dtype: str, act_dtype: str) -> float:
    """HBM bytes of one chip's share of the weights (norm weights in the activation dtype)."""
    mats = sum(m.layers * m.copies * matrix_bytes(m, weight_dtype, act_dtype) for m in weight_matrices(cfg, sh))
    norms = (cfg.num_layers * cfg.norms_per_layer + 1) * cfg.hidden_size * DTYPES[act_dtype].itemsize_bytes
    return mats + norms + mlp_bias_bytes_per_chip(cfg, sh, act_dtype)


def mlp_bias_bytes_per_chip(cfg: ModelConfig, sh: Shard, act_dtype: str) -> float:
    """MLP bias vectors one chip holds (``mlp_bias``): the input projection's share and the whole down bias."""
    if not cfg.mlp_bias:
        return 0.0
    mats = {m.name: m for m in weight_matrices(cfg, sh)}
    elems = sum(m.layers * m.copies * (m.n + mats[down].n) for name, down in
                ((mlp_input_name(cfg), "down"), ("experts_gate_up", "experts_down"), ("shared_gate_up", "shared_down"))
                if (m := mats.get(name)) is not None)
    return elems * DTYPES[act_dtype].itemsize_bytes


def weight_matrix(cfg: ModelConfig, sh: Shard, name: str) -> Matrix:
    """The matrix named ``name`` of :func:`weight_matrices`."""
    return next(m for m in weight_matrices(cfg, sh) if m.name == name)


# --------------------------------------------------------------------------- KV cache


def kv_bytes_per_token_per_layer(cfg: ModelConfig, sh: Shard, kv_dtype: str) -> float:
    """KV-cache bytes one token takes in one layer on one chip."""
    item = DTYPES[kv_dtype].itemsize_bytes
    if cfg.mla is not None:  # one latent + rope row per token, replicated on every chip
        width = cfg.mla.kv_lora_rank + cfg.mla.qk_rope_head_dim
        return width * item + (SCALE_BYTES if is_quantized(kv_dtype) else 0)
    return float(kvcache.kv_bytes_per_token(layers=1, kv_heads=sh.kv_heads, head_dim=cfg.head_dim,
                                            kv_dtype=kv_dtype, kv_scale=default_kv_scale(kv_dtype)))


def layer_kv_tokens(cfg: ModelConfig, tokens: int) -> list[tuple[int, int]]:
    """(layers, tokens each keeps) for the global and the sliding-window layers."""
    out = [(cfg.num_global_layers, tokens)]
    if cfg.sliding_window_tokens:
        out.append((cfg.num_sliding_window_layers, min(tokens, cfg.sliding_window_tokens)))
    return [(n, t) for n, t in out if n]


def kv_bytes_per_sequence(cfg: ModelConfig, sh: Shard, kv_dtype: str, tokens: int, page_size: int) -> float:
    """KV bytes one sequence of ``tokens`` takes on one chip, in whole pages (window layers keep the window)."""
    per_token = kv_bytes_per_token_per_layer(cfg, sh, kv_dtype)
    return sum(n * math.ceil(t / page_size) * page_size * per_token for n, t in layer_kv_tokens(cfg, tokens))


@dataclass(frozen=True, kw_only=True)
class MemoryFit:
    """Whether weights + KV fit in one chip's HBM."""

    hbm_bytes: float
    #: Share of HBM usable for weights + KV (the rest: activations, scratch, fragmentation).
    hbm_utilization: float
    usable_bytes: float
    weight_bytes: float
    kv_bytes: float
    #: KV bytes of one sequence (the mean over a mixed batch).
    kv_bytes_per_sequence: float
    fits: bool
    #: Bytes over the usable HBM (0 when it fits).
    shortfall_bytes: float
    #: Largest batch (of sequences like these, on average) whose weights + KV fit (0: the weights alone do not).
    max_batch: int


def memory_fit(cfg: ModelConfig, step: Step, chip: Any, *,
               hbm_utilization: float = kvcache.DEFAULT_HBM_UTILIZATION) -> MemoryFit:
    """Weights + KV of ``step`` against ``hbm_utilization`` of the chip's HBM (per chip)."""
    if not 0.0 < hbm_utilization <= 1.0:
        raise InputError(f"`hbm_utilization` must be in (0, 1], got {hbm_utilization}")
    sh = shard(cfg, step.tp)
    hbm = float(chip.memory.hbm_bytes_per_chip)
    usable = hbm * hbm_utilization
    weights = weight_bytes_per_chip(cfg, sh, step.weight_dtype, step.act_dtype)
    lengths, counts = np.unique(step.sequence_kv_tokens(), return_counts=True)
    kv = float(sum(c * kv_bytes_per_sequence(cfg, sh, step.kv_dtype, int(t), step.page_size)
                   for t, c in zip(lengths, counts)))
    per_seq = kv / step.batch  # the mean, for a mixed batch
    need = weights + kv
    max_batch = int(max(usable - weights, 0.0) // per_seq) if per_seq > 0 else 0
    return MemoryFit(hbm_bytes=hbm, hbm_utilization=hbm_utilization, usable_bytes=usable, weight_bytes=weights,
                     kv_bytes=kv, kv_bytes_per_sequence=per_seq, fits=need <= usable,
                     shortfall_bytes=max(need - usable, 0.0), max_batch=max_batch)

