"""One transformer step (a prefill chunk or a decode step) composed from the op models.

:func:`predict_step` lists the ops one chip runs in one step of a model
(:class:`~perfmodel.model.configs.ModelConfig`), evaluates each on a chip
with the roofline core, and sums them:

* per layer: (residual add +) RMSNorm, QKV projection (MLA: the down / up
  projections), QK-norm, RoPE, the KV-cache write, attention (prefill: flash
  attention over the chunk and its cached prefix; decode: paged attention;
  MLA decode: absorbed latent attention), the output projection, the
  tensor-parallel all-reduce, the second norm, then the MLP (gate/up GEMM,
  SwiGLU/GeGLU, down GEMM) or the MoE (router + top-k, token dispatch, the
  expert GEMMs over the experts the step touches, shared experts, combine)
  and its all-reduce;
* once: embedding lookup, final norm, vocab projection (last token of each
  sequence), logits all-gather, sampling.

Each op is its own kernel, so the step's floor is the **sum** of the op
floors (each op's roofline bound); the expected time sums the per-op
expected times. Tensor parallelism (``tp`` chips over ICI) follows the
Megatron layout: heads, MLP and expert widths and the vocabulary are split,
KV heads are replicated when there are fewer than ``tp``, the router and
MLA's down projections are replicated; two all-reduces per layer.

MoE routing is modelled as uniform: a step of T tokens with top-k of E
experts touches ``E * (1 - (1 - k/E)^T)`` experts (expected distinct
count), each receiving ``T*k / touched`` tokens (the mean over all experts
is ``T*k/E``); only touched experts' weights are read.

No jax import here.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from perfmodel.errors import InputError
from perfmodel.jsonable import to_jsonable
from perfmodel.model import attention, collectives, core, fused, kvcache, memops, sampling
from perfmodel.model.configs import ModelConfig
from perfmodel.model.core import UNITS, OpCost, Roofline, evaluate
from perfmodel.model.dtypes import DTYPES, SCALE_BYTES, default_kv_scale, is_quantized, matmul_path, parse_dtype
from perfmodel.model.gemm import gemm, grouped_gemm, resolve_weight_scale, uniform_group_sizes

PHASES: tuple[str, ...] = ("prefill", "decode")
#: A ragged step of a serving engine: prefill chunks and decode tokens of many sequences at once
#: (:func:`mixed_step`; the CLI's phases stay prefill and decode).
MIXED = "mixed"
DEFAULT_PAGE_SIZE = 16
#: Logits are upcast to f32 before sampling (as vLLM's samplers do).
LOGITS_DTYPE = "fp32"
#: Router top-k selection per (token, expert) score: sigmoid/softmax (3 VPU + 1 EUP), then k rounds of
#: compare + select value + select index.
ROUTER_SCORE_VPU_OPS, ROUTER_SCORE_EUP_OPS, ROUTER_TOPK_VPU_OPS_PER_ROUND = 3, 1, 3
#: Combining expert outputs: one multiply-add per (token, expert, hidden) element.
MOE_COMBINE_VPU_OPS = 2


# --------------------------------------------------------------------------- inputs


@dataclass(frozen=True, kw_only=True)
class Step:
    """What one step processes, on how many chips, in which dtypes."""

    #: "prefill" (a chunk of new tokens per sequence), "decode" (one new token per sequence) or "mixed" (a
    #: ragged step: ``query_lens[i]`` new tokens of sequence i over its ``context_lens[i]``, see :func:`mixed_step`).
    phase: str
    #: Sequences in the step.
    batch: int
    #: Decode: KV tokens each sequence attends to (its context, the new token included).
    #: Prefill: tokens already cached before this chunk (0 for a fresh prompt).
    context_tokens: int
    #: Prefill: new tokens per sequence in this chunk. Decode: 1.
    chunk_tokens: int
    weight_dtype: str
    act_dtype: str
    kv_dtype: str
    #: Tensor-parallel degree (chips, over ICI).
    tp: int
    page_size: int
    #: Decode only: one KV length per sequence (then ``batch`` is their count and ``context_tokens`` their
    #: maximum); None when all sequences share ``context_tokens``.
    context_lens: tuple[int, ...] | None = None
    #: Scales of quantized weights: "per-channel" (the default for int8/int4/fp8 weights) or "per-block"
    #: (``scale_block`` rows of K per scale); "none" for float weights.
    weight_scale: str = "none"
    #: K rows per scale with ``weight_scale`` per-block.
    scale_block: int | None = None
    #: int8 x int8 (w8a8) or int8 x int4 (w4a8) weight GEMMs: activations read in ``act_dtype`` and quantized per
    #: token inside each GEMM (the bundled matmul's ``quantize_x``); the MoE expert GEMMs keep ``act_dtype``
    #: activations (the bundled grouped_matmul has no in-kernel quantization).
    quantize_activations: bool = False
    #: Mixed only: new tokens of each sequence in this step (prefill chunks > 1, decode tokens 1; a speculative
    #: verification k + 1); ``context_lens`` then holds each sequence's KV tokens after the step.
    query_lens: tuple[int, ...] | None = None

    def weight_gemm(self, high_precision: bool = False, *, in_kernel_quantization: bool = True) -> dict[str, Any]:
        """Keyword arguments of :func:`perfmodel.model.gemm.gemm` for a weight matrix of this step: the
        activation and weight dtypes, the weight scales and, with ``quantize_activations`` (and a kernel that
        quantizes, ``in_kernel_quantization``), int8 activations quantized in the kernel. ``high_precision``
        (router, ...): weights kept in the activation dtype."""
        if high_precision:
            return dict(lhs_dtype=self.act_dtype, rhs_dtype=self.act_dtype, out_dtype=self.act_dtype)
        kw: dict[str, Any] = dict(lhs_dtype=self.act_dtype, rhs_dtype=self.weight_dtype, out_dtype=self.act_dtype,
                                  weight_scale=self.weight_scale, scale_block=self.scale_block)
        if self.quantize_activations and in_kernel_quantization:
            kw.update(lhs_dtype="int8", lhs_source_dtype=self.act_dtype)
        return kw

    @property
    def tokens(self) -> int:
        """Tokens the step pushes through the layers."""
        if self.query_lens is not None:
            return sum(self.query_lens)
        return self.batch * self.chunk_tokens

    @property
    def kv_tokens(self) -> int:
        """KV tokens per sequence after the step (what attention reads and the cache holds; mixed: the longest)."""
        return self.context_tokens if self.phase in ("decode", MIXED) else self.context_tokens + self.chunk_tokens

    def sequence_kv_tokens(self) -> np.ndarray:
        """KV tokens of each sequence after the step (length ``batch``)."""
        if self.context_lens is not None:
            return np.asarray(self.context_lens, dtype=np.int64)
        return np.full(self.batch, self.kv_tokens, dtype=np.int64)


def make_step(*, phase: str = "decode", batch: int | None = None, context: int | None = None,
              prefill_len: int | None = None, context_lens: Any = None, weight_dtype: str = "bf16",
              act_dtype: str = "bf16", kv_dtype: str | None = None, tp: int = 1,
              page_size: int = DEFAULT_PAGE_SIZE, weight_scale: str | None = None, scale_block: int | None = None,
              quantize_activations: bool = False) -> Step:
    """Validated :class:`Step`; one-line InputError naming the flag for bad input.

    Decode: ``context`` = KV length each sequence attends to (default 1024),
    or ``context_lens`` = one length per sequence (a mixed batch; ``batch``
    is then their count). Prefill: ``prefill_len`` = new tokens per sequence
    (default 2048) and ``context`` = tokens already cached before the chunk
    (default 0). ``batch`` defaults to 1; ``kv_dtype`` to ``act_dtype``. ``weight_scale`` / ``scale_block`` /
    ``quantize_activations``: see :class:`Step`.
    """
    if phase not in PHASES:
        raise InputError(f"`phase`: got '{phase}'; use prefill or decode")
    lens = None
    if context_lens is not None:
        if phase != "decode":
            raise InputError("`context_lens` / `context_dist` apply to `phase` decode; prefill takes one `context`")
        if context is not None:
            raise InputError("give `context` or `context_lens` / `context_dist`, not both")
        arr = np.atleast_1d(np.asarray(context_lens))
        if arr.ndim != 1 or arr.size == 0 or arr.dtype.kind not in "iu" or np.any(arr < 1):
            raise InputError(f"`context_lens`: give whole numbers >= 1, one per sequence, got {context_lens!r}")
        if batch is not None and batch != arr.size:
            raise InputError(f"`batch` {batch} disagrees with the {arr.size} `context_lens` given; drop `batch`")
        lens, batch, context = tuple(int(x) for x in arr), int(arr.size), int(arr.max())
    batch = 1 if batch is None else batch
    _positive("`batch`", batch)
    _positive("`tp`", tp)
    _positive("`page_size`", page_size)
    if phase == "decode":
        if prefill_len is not None:
            raise InputError("`prefill_len` applies to `phase` prefill; for decode give `context`")
        context = 1024 if context is None else context
        _positive("`context`", context)
        chunk = 1
    else:
        chunk = 2048 if prefill_len is None else prefill_len
        _positive("`prefill_len`", chunk)
        context = 0 if context is None else context
        if not isinstance(context, (int, np.integer)) or context < 0:
            raise InputError(f"`context` must be >= 0 for prefill (tokens cached before the chunk), got {context}")
    weights, acts = parse_dtype(weight_dtype, "`weight_dtype`"), parse_dtype(act_dtype, "`act_dtype`")
    scale, block = resolve_weight_scale(weights, weight_scale, scale_block, dtype_field="weight_dtype")
    if quantize_activations and (weights not in ("int8", "int4") or is_quantized(acts)):
        raise InputError(f"`quantize_activations`: int8 x int8 / int8 x int4 GEMMs quantize float activations for "
                         f"int8 or int4 weights; got `weight_dtype` {weights} and `act_dtype` {acts} (use "
                         "--weight-dtype int8 or int4 with --act-dtype bf16)")
    return Step(phase=phase, batch=int(batch), context_tokens=int(context), chunk_tokens=int(chunk),
                weight_dtype=weights, act_dtype=acts,
                kv_dtype=parse_dtype(kv_dtype or act_dtype, "`kv_dtype`"), tp=int(tp), page_size=int(page_size),
                context_lens=lens, weight_scale=scale, scale_block=int(block) if scale == "per-block" else None,
                quantize_activations=bool(quantize_activations))


def mixed_step(*, query_lens: Any, context_lens: Any, weight_dtype: str = "bf16", act_dtype: str = "bf16",
               kv_dtype: str | None = None, tp: int = 1, page_size: int = DEFAULT_PAGE_SIZE,
               weight_scale: str | None = None, scale_block: int | None = None,
               quantize_activations: bool = False) -> Step:
    """Validated ragged :class:`Step` of a serving engine (vLLM TPU's unified step): sequence i pushes
    ``query_lens[i]`` new tokens (a prefill chunk, a decode token, a speculative verification) and attends over
    ``context_lens[i]`` KV tokens, the new ones included. Attention is one ragged paged-attention kernel over all
    of them; every other op sees the step's ``sum(query_lens)`` tokens, the LM head one row per sequence."""
    q = np.atleast_1d(np.asarray(query_lens))
    c = np.atleast_1d(np.asarray(context_lens))
    for name, arr in (("query_lens", q), ("context_lens", c)):
        if arr.ndim != 1 or arr.size == 0 or arr.dtype.kind not in "iu" or np.any(arr < 1):
            raise InputError(f"`{name}`: give whole numbers >= 1, one per sequence")
    if q.size != c.size:
        raise InputError(f"`query_lens` has {q.size} sequences but `context_lens` has {c.size}; give one of each")
    if np.any(q > c):
        raise InputError("`query_lens` exceeds `context_lens`: the context includes the step's new tokens")
    base = make_step(phase="decode", batch=int(q.size), context=int(c.max()), weight_dtype=weight_dtype,
                     act_dtype=act_dtype, kv_dtype=kv_dtype, tp=tp, page_size=page_size, weight_scale=weight_scale,
                     scale_block=scale_block, quantize_activations=quantize_activations)
    return dataclasses.replace(base, phase=MIXED, query_lens=tuple(int(x) for x in q),
                               context_lens=tuple(int(x) for x in c))


def _positive(flag: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise InputError(f"{flag} must be a whole number >= 1, got {value}")


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
        out.append(Matrix(name=_mlp_in(cfg), k=h, n=(2 if cfg.mlp_gated else 1) * sh.intermediate,
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


def _mlp_in(cfg: ModelConfig) -> str:
    """Name of the dense MLP's input projection: "gate_up" (gated) or "up"."""
    return "gate_up" if cfg.mlp_gated else "up"


#: MLP activation (configs.MLP_ACTIVATIONS) -> the elementwise cost it takes (perfmodel.model.elementwise.EPILOGUES;
#: erf GELU is costed as the tanh form) and, gated, the fused GLU kind (perfmodel.model.fused.GLU_KINDS).
MLP_EPILOGUE = {"silu": "silu", "gelu_tanh": "gelu", "gelu": "gelu", "relu": "relu"}
GLU_KIND = {"silu": "swiglu", "gelu_tanh": "geglu", "gelu": "geglu"}


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
                ((_mlp_in(cfg), "down"), ("experts_gate_up", "experts_down"), ("shared_gate_up", "shared_down"))
                if (m := mats.get(name)) is not None)
    return elems * DTYPES[act_dtype].itemsize_bytes


def _matrix(cfg: ModelConfig, sh: Shard, name: str) -> Matrix:
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


# --------------------------------------------------------------------------- MoE routing


@dataclass(frozen=True, kw_only=True)
class Routing:
    """How one MoE layer's tokens spread over experts (uniform routing)."""

    #: Token-expert assignments: tokens x top-k.
    assignments: int
    #: Mean tokens per expert over all experts: tokens * top_k / experts.
    tokens_per_expert: float
    #: Expected distinct experts the step touches.
    experts_touched: int
    #: Tokens per touched expert: ``heavy`` experts get ``light + 1``, the rest ``light``.
    light_tokens: int
    heavy_experts: int


def routing(tokens: int, experts: int, top_k: int) -> Routing:
    """Expected spread of ``tokens`` over ``experts`` with top-``top_k`` uniform routing."""
    assignments = tokens * top_k
    expected = experts * (1.0 - (1.0 - top_k / experts) ** tokens)
    touched = int(min(max(round(expected), top_k), experts, assignments))
    light, heavy = divmod(assignments, touched)
    return Routing(assignments=assignments, tokens_per_expert=assignments / experts, experts_touched=touched,
                   light_tokens=light, heavy_experts=heavy)


def _expert_gemm(name: str, r: Routing, *, n: int, k: int, step: Step, chip: Any) -> OpCost:
    """Grouped GEMM over the touched experts (the bundled grouped_matmul's op model): the assignments split
    evenly over them, ``heavy`` experts of light+1 tokens, the rest of light tokens."""
    sizes = uniform_group_sizes(r.assignments, r.experts_touched)
    # experts keep float activations: grouped_matmul has no in-kernel quantization
    return _named(grouped_gemm(group_sizes=sizes, n=n, k=k, chip=chip,
                               **step.weight_gemm(in_kernel_quantization=False)), name)


# --------------------------------------------------------------------------- helpers


def _sum(parts: list[OpCost]) -> OpCost:
    """Work of several same-dtype costs added into one (one kernel doing all of it)."""
    if len(parts) == 1:
        return parts[0]
    total = {f: sum(getattr(p, f) for p in parts) for f in core._ADDITIVE}  # the fields core.combine adds
    notes = tuple(dict.fromkeys(n for p in parts for n in p.notes))
    return dataclasses.replace(parts[0], notes=notes, **total)


def _named(cost: OpCost, name: str) -> OpCost:
    return dataclasses.replace(cost, name=name)


def _local(name: str, *, vpu: float = 0.0, eup: float = 0.0, read: float = 0.0, write: float = 0.0,
           notes: tuple[str, ...] = ()) -> OpCost:
    """A small op the op library does not model (embedding gather, router top-k, MoE dispatch / combine)."""
    return OpCost(name=name, vpu_ops=vpu, eup_ops=eup, hbm_read_bytes=read, hbm_write_bytes=write, notes=notes)


def _proj(name: str, mat: Matrix, m: int, step: Step, chip: Any, epilogue: tuple[str, ...] = ()) -> OpCost:
    """[m, k] x [k, n] projection with the step's activation and weight dtypes (and a fused epilogue)."""
    return _named(gemm(m=m, n=mat.n, k=mat.k, epilogue=epilogue, chip=chip, **step.weight_gemm(mat.high_precision)),
                  name)


# --------------------------------------------------------------------------- the op list


@dataclass(frozen=True, kw_only=True)
class StepOp:
    """One op of the step as one chip runs it, ``count`` times (once per layer of its kind)."""

    name: str
    #: "embed", "attention", "mlp", "moe", "tp" (collectives) or "head".
    block: str
    count: int
    cost: OpCost
    roofline: Roofline

    @property
    def floor_s(self) -> float:
        return self.count * float(self.roofline.floor_s)

    @property
    def expected_s(self) -> float:
        return self.count * float(self.roofline.expected_s)

    @property
    def no_overlap_s(self) -> float:
        return self.count * float(self.roofline.no_overlap_s)

    @property
    def bound(self) -> str:
        return str(self.roofline.bound)

    @property
    def hbm_bytes(self) -> float:
        return self.count * float(self.cost.hbm_bytes)

    @property
    def useful_flops(self) -> float:
        return self.count * float(self.cost.useful_flops)

    @property
    def ici_bytes(self) -> float:
        return self.count * float(self.cost.ici_bytes)


def _attention_ops(cfg: ModelConfig, sh: Shard, step: Step, chip: Any) -> list[tuple[str, int, OpCost]]:
    """(name, count, cost) of one attention block, for every layer."""
    L, T, act = cfg.num_layers, step.tokens, step.act_dtype
    h = cfg.hidden_size
    ops: list[tuple[str, int, OpCost]] = [
        ("attn_norm", L, fused.rms_norm(tokens=T, hidden=h, dtype=act, residual=True, chip=chip))]
    kv_scale = default_kv_scale(step.kv_dtype)
    if cfg.mla is None:
        ops.append(("qkv_proj", L, _proj("qkv_proj", _matrix(cfg, sh, "qkv_proj"), T, step, chip)))
        if cfg.qk_norm:
            ops.append(("qk_norm", L, fused.rms_norm(tokens=T * (sh.q_heads + sh.kv_heads), hidden=cfg.head_dim,
                                                     dtype=act, residual=False, chip=chip)))
        ops.append(("rope", L, fused.rope(tokens=T, heads=sh.q_heads + sh.kv_heads, head_dim=cfg.head_dim,
                                          dtype=act, chip=chip)))
        ops.append(("kv_write", L, kvcache.kv_cache_update(
            num_tokens=T, kv_heads=sh.kv_heads, head_dim=cfg.head_dim, page_size=step.page_size,
            kv_dtype=step.kv_dtype, src_dtype=act, kv_scale=kv_scale, chip=chip)))
        for label, layers, window in _attention_kinds(cfg):
            if step.phase == MIXED:
                q_lens, lens = ragged_lens(step, window)
                cost = attention.ragged_paged_attention(
                    query_lens=q_lens, context_lens=lens, q_heads=sh.q_heads, kv_heads=sh.kv_heads,
                    head_dim=cfg.head_dim, page_size=step.page_size, kv_dtype=step.kv_dtype, q_dtype=act,
                    kv_scale=kv_scale, chip=chip)
            elif step.phase == "decode":
                lens, batch = _decode_lens(step, window)
                cost = attention.paged_decode_attention(
                    context_lens=lens, batch=batch, q_heads=sh.q_heads, kv_heads=sh.kv_heads, head_dim=cfg.head_dim,
                    page_size=step.page_size, kv_dtype=step.kv_dtype, q_dtype=act, kv_scale=kv_scale, chip=chip)
            else:
                cost = attention.flash_attention(
                    batch=step.batch, q_len=step.chunk_tokens, kv_len=step.kv_tokens, q_heads=sh.q_heads,
                    kv_heads=sh.kv_heads, head_dim=cfg.head_dim, causal=True, sliding_window=window, dtype=act,
                    chip=chip)
            ops.append((label, layers, cost))
        ops.append(("o_proj", L, _proj("o_proj", _matrix(cfg, sh, "o_proj"), T, step, chip)))
    else:
        ops += _mla_ops(cfg, sh, step, chip)
    if sh.tp > 1:
        ops.append(("all_reduce(attn)", L, collectives.all_reduce(bytes_per_chip=T * h * DTYPES[act].itemsize_bytes,
                                                                  num_chips=sh.tp, chip=chip)))
    return ops


def ragged_lens(step: Step, window: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(query_lens, context_lens) of a mixed step as a window layer sees them: a sliding window of ``window``
    tokens keeps at most ``window + query_len - 1`` of a sequence's KV tokens in play (its first new token sees
    the window, its last one the window shifted by the chunk)."""
    q = np.asarray(step.query_lens, dtype=np.int64)
    return q, window_lens(q, np.asarray(step.context_lens, dtype=np.int64), window)


def window_lens(query_lens: np.ndarray, context_lens: np.ndarray, window: int | None) -> np.ndarray:
    """KV tokens in play for sequences pushing ``query_lens`` tokens over ``context_lens`` in a layer with a
    sliding window of ``window`` tokens (None: all of them)."""
    return np.minimum(context_lens, window + query_lens - 1) if window else context_lens


def context_op_names(cfg: ModelConfig) -> frozenset[str]:
    """Names of the step's ops whose work follows each sequence's own context (the attention kernels; MLA's
    prefill also expands the cached latents with kv_up): :func:`sequence_attention_ops` prices them per
    sequence, every other op follows the step's token and sequence counts only."""
    if cfg.mla is not None:
        return frozenset({"mla_attention", "kv_up", "attention"})
    return frozenset(label for label, _, _ in _attention_kinds(cfg))


def sequence_attention_ops(cfg: ModelConfig, step: Step, chip: Any, query_lens: np.ndarray,
                           context_lens: np.ndarray) -> list[tuple[str, int, OpCost]]:
    """(name, layers, cost) of the :func:`context_op_names` ops for N sequences, each priced alone: array costs
    over N (sequence i pushes ``query_lens[i]`` tokens over ``context_lens[i]``), in ``step``'s dtypes and
    sharding. A serving simulator sums them over a step's sequences (perfmodel.serve.steptime). Query lengths
    must be all 1 (decode) or all above 1 (prefill chunks, verifications) for MLA, whose two forms differ."""
    sh = shard(cfg, step.tp)
    q = np.asarray(query_lens, dtype=np.int64)[:, None]
    c = np.asarray(context_lens, dtype=np.int64)[:, None]
    act, kv_scale = step.act_dtype, default_kv_scale(step.kv_dtype)
    if cfg.mla is None:
        return [(label, layers, attention.ragged_paged_attention(
            query_lens=q, context_lens=window_lens(q, c, window), q_heads=sh.q_heads,
            kv_heads=sh.kv_heads, head_dim=cfg.head_dim, page_size=step.page_size, kv_dtype=step.kv_dtype,
            q_dtype=act, kv_scale=kv_scale, chip=chip)) for label, layers, window in _attention_kinds(cfg)]
    m, L = cfg.mla, cfg.num_layers
    if np.all(q == 1):
        return [("mla_attention", L, attention.mla_decode(
            context_lens=c, batch=None, q_heads=sh.q_heads, page_size=step.page_size, kv_lora_rank=m.kv_lora_rank,
            rope_head_dim=m.qk_rope_head_dim, kv_dtype=step.kv_dtype, q_dtype=act, chip=chip))]
    if np.any(q == 1):
        raise InputError("`query_lens`: MLA prices decode tokens and prefill chunks in two calls; give all 1 or "
                         "all above 1")
    return _mla_expanded(cfg, sh, step, chip, batch=1, q_len=q[:, 0], kv_len=c[:, 0])


def _decode_lens(step: Step, window: int | None = None) -> tuple[Any, int | None]:
    """(context_lens, batch) for the paged-attention models: one shared length and the batch, or the list."""
    if step.context_lens is None:
        return min(step.kv_tokens, window or step.kv_tokens), step.batch
    lens = step.sequence_kv_tokens()
    return (np.minimum(lens, window) if window else lens), None


def _attention_kinds(cfg: ModelConfig) -> list[tuple[str, int, int | None]]:
    """(row label, layers, window) for global and sliding-window attention layers."""
    kinds = [("attention" if not cfg.sliding_window_tokens else "attention(global)", cfg.num_global_layers, None)]
    if cfg.sliding_window_tokens:
        kinds.append((f"attention(window {cfg.sliding_window_tokens})", cfg.num_sliding_window_layers,
                      cfg.sliding_window_tokens))
    return [k for k in kinds if k[1]]


def _mla_ops(cfg: ModelConfig, sh: Shard, step: Step, chip: Any) -> list[tuple[str, int, OpCost]]:
    """Latent attention: down projections, latent norms, rope, latent cache write, attention, up / out projections."""
    m, L, T, act = cfg.mla, cfg.num_layers, step.tokens, step.act_dtype
    latent = m.kv_lora_rank + m.qk_rope_head_dim
    kv_scale = default_kv_scale(step.kv_dtype)
    ops: list[tuple[str, int, OpCost]] = []
    if m.q_lora_rank is None:
        ops.append(("q_proj", L, _proj("q_proj", _matrix(cfg, sh, "q_proj"), T, step, chip)))
        ops.append(("kv_down", L, _proj("kv_down", _matrix(cfg, sh, "kv_down"), T, step, chip)))
        ops.append(("latent_norm", L, fused.rms_norm(tokens=T, hidden=m.kv_lora_rank, dtype=act, residual=False,
                                                     chip=chip)))
    else:
        ops.append(("qkv_down", L, _proj("qkv_down", _matrix(cfg, sh, "qkv_down"), T, step, chip)))
        ops.append(("latent_norms", L, fused.rms_norm(tokens=T, hidden=m.q_lora_rank + m.kv_lora_rank, dtype=act,
                                                      residual=False, chip=chip)))
        ops.append(("q_up", L, _proj("q_up", _matrix(cfg, sh, "q_up"), T, step, chip)))
    ops.append(("rope", L, fused.rope(tokens=T, heads=sh.q_heads + 1, head_dim=m.qk_rope_head_dim, dtype=act,
                                      chip=chip)))
    # kv_cache_update writes K and V rows of head_dim each; MLA writes one latent row of `latent` values:
    # the same bytes as K and V rows of latent/2 (exact for even widths, e.g. DeepSeek's 576).
    ops.append(("kv_write", L, kvcache.kv_cache_update(
        num_tokens=T, kv_heads=1, head_dim=max(latent // 2, 1), page_size=step.page_size, kv_dtype=step.kv_dtype,
        src_dtype=act, kv_scale=kv_scale, chip=chip)))
    kv_up = _matrix(cfg, sh, "kv_up")
    if step.phase == MIXED:
        # Decode tokens (query length 1) take the absorbed form, prefill chunks the expanded one, as vLLM's MLA
        # backends split a mixed batch.
        q_lens, lens = ragged_lens(step)
        dec = q_lens == 1
        if dec.any():
            ops += _mla_absorbed(cfg, sh, step, chip, tokens=int(dec.sum()), context_lens=lens[dec], batch=None)
        for q, c in zip(q_lens[~dec], lens[~dec]):
            ops += _mla_expanded(cfg, sh, step, chip, batch=1, q_len=int(q), kv_len=int(c))
    elif step.phase == "decode":
        lens, batch = _decode_lens(step)
        ops += _mla_absorbed(cfg, sh, step, chip, tokens=T, context_lens=lens, batch=batch)
    else:
        ops += _mla_expanded(cfg, sh, step, chip, batch=step.batch, q_len=step.chunk_tokens, kv_len=step.kv_tokens)
    ops.append(("o_proj", L, _proj("o_proj", _matrix(cfg, sh, "o_proj"), T, step, chip)))
    return ops


def _mla_absorbed(cfg: ModelConfig, sh: Shard, step: Step, chip: Any, *, tokens: int, context_lens: Any,
                  batch: int | None) -> list[tuple[str, int, OpCost]]:
    """MLA decode, absorbed form: q_nope x W_UK per head into latent space, attention over the latent cache,
    latent output x W_UV per head (W_UK and W_UV are the two halves of kv_up)."""
    m, L, act = cfg.mla, cfg.num_layers, step.act_dtype
    absorb = dict(batch=sh.q_heads, lhs_dtype=act, rhs_dtype=step.weight_dtype, out_dtype=act, chip=chip)
    return [
        ("q_absorb", L, _named(gemm(m=tokens, n=m.kv_lora_rank, k=m.qk_nope_head_dim, **absorb), "q_absorb")),
        ("mla_attention", L, attention.mla_decode(
            context_lens=context_lens, batch=batch, q_heads=sh.q_heads, page_size=step.page_size,
            kv_lora_rank=m.kv_lora_rank, rope_head_dim=m.qk_rope_head_dim, kv_dtype=step.kv_dtype, q_dtype=act,
            chip=chip)),
        ("v_absorb", L, _named(gemm(m=tokens, n=m.v_head_dim, k=m.kv_lora_rank, **absorb), "v_absorb")),
    ]


def _mla_expanded(cfg: ModelConfig, sh: Shard, step: Step, chip: Any, *, batch: int, q_len: int,
                  kv_len: int) -> list[tuple[str, int, OpCost]]:
    """MLA prefill: expand every cached and new latent to per-head K_nope and V, then flash attention with the
    192-wide query/key heads (V is 128 wide: the PV product is over-counted by 192/128)."""
    L = cfg.num_layers
    return [
        ("kv_up", L, _proj("kv_up", _matrix(cfg, sh, "kv_up"), batch * kv_len, step, chip)),
        ("attention", L, attention.flash_attention(
            batch=batch, q_len=q_len, kv_len=kv_len, q_heads=sh.q_heads, kv_heads=sh.q_heads, head_dim=cfg.head_dim,
            causal=True, dtype=step.act_dtype, chip=chip)),
    ]


def _mlp_ops(cfg: ModelConfig, sh: Shard, step: Step, chip: Any) -> list[tuple[str, str, int, OpCost]]:
    """(block, name, count, cost) of the MLP / MoE half of every layer."""
    T, act, h = step.tokens, step.act_dtype, cfg.hidden_size
    # A non-gated MLP's activation rides on the up projection's epilogue (XLA fuses it); a gated one is its own
    # fused GLU kernel over the gate and up halves. Biases are epilogues of the projections.
    glu = GLU_KIND.get(cfg.mlp_activation) if cfg.mlp_gated else None
    bias = ("bias",) if cfg.mlp_bias else ()
    ops: list[tuple[str, str, int, OpCost]] = [
        ("mlp", "mlp_norm", cfg.num_layers, fused.rms_norm(tokens=T, hidden=h, dtype=act, residual=True, chip=chip))]
    nd = cfg.num_dense_layers
    if nd:
        up = _mlp_in(cfg)
        if glu is None:
            ops.append(("mlp", up, nd, _proj(up, _matrix(cfg, sh, up), T, step, chip,
                                             epilogue=bias + (MLP_EPILOGUE[cfg.mlp_activation],))))
        else:
            ops += [("mlp", up, nd, _proj(up, _matrix(cfg, sh, up), T, step, chip, epilogue=bias)),
                    ("mlp", glu, nd, fused.glu(tokens=T, intermediate=sh.intermediate, dtype=act, kind=glu, chip=chip))]
        ops.append(("mlp", "down", nd, _proj("down", _matrix(cfg, sh, "down"), T, step, chip, epilogue=bias)))
    if cfg.moe is not None:
        moe, nm = cfg.moe, cfg.moe.num_moe_layers
        r = routing(T, moe.num_experts, moe.experts_per_token)
        item = DTYPES[act].itemsize_bytes
        scores = T * moe.num_experts
        topk = _local("topk", vpu=scores * (ROUTER_SCORE_VPU_OPS + ROUTER_TOPK_VPU_OPS_PER_ROUND *
                                            moe.experts_per_token),
                      eup=scores * ROUTER_SCORE_EUP_OPS, read=scores * item, write=T * moe.experts_per_token * 8)
        router = _proj("router", _matrix(cfg, sh, "router"), T, step, chip)
        ops.append(("moe", "router+topk", nm, _sum([router, dataclasses.replace(topk, mxu_dtype=router.mxu_dtype)])))
        ops.append(("moe", "dispatch", nm, _local(
            "dispatch", read=T * h * item, write=r.assignments * h * item,
            notes=("tokens gathered into expert order (one row per token-expert assignment)",))))
        gate_up, down = _matrix(cfg, sh, "experts_gate_up"), _matrix(cfg, sh, "experts_down")
        ops += [
            ("moe", "experts_gate_up", nm, _expert_gemm("experts_gate_up", r, n=gate_up.n, k=gate_up.k, step=step,
                                                          chip=chip)),
            ("moe", f"experts_{glu}", nm, fused.glu(tokens=r.assignments, intermediate=sh.expert_intermediate,
                                                     dtype=act, kind=glu, chip=chip)),
            ("moe", "experts_down", nm, _expert_gemm("experts_down", r, n=down.n, k=down.k, step=step, chip=chip)),
        ]
        if sh.shared_intermediate:
            ops += [
                ("moe", "shared_gate_up", nm, _proj("shared_gate_up", _matrix(cfg, sh, "shared_gate_up"), T, step,
                                                    chip)),
                ("moe", f"shared_{glu}", nm, fused.glu(tokens=T, intermediate=sh.shared_intermediate, dtype=act,
                                                        kind=glu, chip=chip)),
                ("moe", "shared_down", nm, _proj("shared_down", _matrix(cfg, sh, "shared_down"), T, step, chip)),
            ]
        ops.append(("moe", "combine", nm, _local(
            "combine", vpu=r.assignments * h * MOE_COMBINE_VPU_OPS, read=r.assignments * h * item,
            write=T * h * item, notes=("expert outputs weighted and summed back into token order",))))
    if sh.tp > 1:
        ops.append(("tp", "all_reduce(mlp)", cfg.num_layers, collectives.all_reduce(
            bytes_per_chip=T * h * DTYPES[act].itemsize_bytes, num_chips=sh.tp, chip=chip)))
    return ops


def _head_ops(cfg: ModelConfig, sh: Shard, step: Step, chip: Any) -> list[tuple[str, str, int, OpCost]]:
    """Embedding lookup (and its all-reduce under TP), final norm, vocab projection, logits all-gather, sampling."""
    T, B, act, h = step.tokens, step.batch, step.act_dtype, cfg.hidden_size
    act_item, w_item = DTYPES[act].itemsize_bytes, DTYPES[step.weight_dtype].itemsize_bytes
    ops: list[tuple[str, str, int, OpCost]] = [
        ("embed", "embed", 1, _named(memops.gather(rows=T, row_bytes=h * w_item, chip=chip), "embed"))]
    if sh.tp > 1:  # the table is split by vocabulary: each chip looks up its rows (zeros elsewhere), then all-reduce
        ops.append(("tp", "all_reduce(embed)", 1, collectives.all_reduce(bytes_per_chip=T * h * act_item,
                                                                          num_chips=sh.tp, chip=chip)))
    ops.append(("head", "final_norm", 1, fused.rms_norm(tokens=T, hidden=h, dtype=act, residual=True, chip=chip)))
    # [B, hidden] x [hidden, vocab / tp] for the last token of each sequence (a tied head reads the embedding table)
    ops.append(("head", "lm_head", 1, _named(gemm(m=B, n=sh.vocab, k=h, chip=chip,
                                                  **{**step.weight_gemm(), "out_dtype": LOGITS_DTYPE}), "lm_head")))
    if sh.tp > 1:
        ops.append(("tp", "all_gather(logits)", 1, collectives.all_gather(
            bytes_per_chip=B * sh.vocab * DTYPES[LOGITS_DTYPE].itemsize_bytes, num_chips=sh.tp, chip=chip)))
    ops.append(("head", "sampling", 1, sampling.sampling(batch=B, vocab=cfg.vocab_size, dtype=LOGITS_DTYPE,
                                                         temperature=True, chip=chip)))
    return ops


def step_ops(cfg: ModelConfig, step: Step, chip: Any) -> list[StepOp]:
    """Every op of the step, in execution order, evaluated on chip (one instance; ``count`` = layers)."""
    sh = shard(cfg, step.tp)
    rows: list[tuple[str, str, int, OpCost]] = []
    head = _head_ops(cfg, sh, step, chip)
    embed = [r for r in head if r[0] == "embed" or r[1] == "all_reduce(embed)"]
    rows += embed
    rows += [("tp" if name.startswith("all_") else "attention", name, n, c)
             for name, n, c in _attention_ops(cfg, sh, step, chip)]
    rows += _mlp_ops(cfg, sh, step, chip)
    rows += head[len(embed):]
    return [StepOp(name=name, block=block, count=n, cost=_named(c, name), roofline=evaluate(c, chip))
            for block, name, n, c in rows if n]


# --------------------------------------------------------------------------- the prediction


@dataclass(frozen=True, kw_only=True)
class StepPrediction:
    """One step of a model on one chip (times are per step; every chip of the TP group runs the same ops)."""

    model: ModelConfig
    chip: Any
    step: Step
    ops: tuple[StepOp, ...]
    memory: MemoryFit
    routing: Routing | None

    # ----- totals

    @property
    def floor_s(self) -> float:
        """Sum of the op floors (each op a kernel bounded by its slowest unit)."""
        return sum(op.floor_s for op in self.ops)

    @property
    def expected_s(self) -> float:
        return sum(op.expected_s for op in self.ops)

    @property
    def no_overlap_s(self) -> float:
        return sum(op.no_overlap_s for op in self.ops)

    @property
    def unit_s(self) -> dict[str, float]:
        """Seconds per unit at peak, summed over the step (the fully overlapped bound is their max)."""
        return {u: sum(op.count * float(op.roofline.unit_s[u]) for op in self.ops) for u in UNITS}

    @property
    def overlapped_floor_s(self) -> float:
        """Lower bound if every op overlapped every other: the busiest unit's total time."""
        return max(self.unit_s.values())

    @property
    def hbm_bytes(self) -> float:
        return sum(op.hbm_bytes for op in self.ops)

    @property
    def useful_flops(self) -> float:
        return sum(op.useful_flops for op in self.ops)

    @property
    def ici_bytes(self) -> float:
        return sum(op.ici_bytes for op in self.ops)

    @property
    def bound_shares(self) -> dict[str, float]:
        """Share of the floor spent in ops of each bound ("HBM-bound": 0.93, ...), largest first."""
        total = self.floor_s or 1.0
        shares: dict[str, float] = {}
        for op in self.ops:
            shares[op.bound] = shares.get(op.bound, 0.0) + op.floor_s / total
        return dict(sorted(shares.items(), key=lambda kv: -kv[1]))

    @property
    def bound(self) -> str:
        """The bound of the ops that take most of the floor."""
        return next(iter(self.bound_shares))

    @property
    def tokens_per_step(self) -> int:
        """Tokens produced (decode) or ingested (prefill) by the whole TP group in one step."""
        return self.step.tokens

    @property
    def tokens_per_s(self) -> float:
        """System throughput at the expected step time (all tp chips together)."""
        return self.tokens_per_step / self.expected_s

    @property
    def tokens_per_s_per_chip(self) -> float:
        return self.tokens_per_s / self.step.tp

    @property
    def tokens_per_s_at_floor(self) -> float:
        """System throughput at the floor: the bound the expected throughput stays under."""
        return self.tokens_per_step / self.floor_s

    @property
    def tokens_per_s_per_chip_at_floor(self) -> float:
        return self.tokens_per_s_at_floor / self.step.tp

    @property
    def compute_dtype(self) -> str:
        """MXU dtype of the weight GEMMs (whose peak MFU is measured against)."""
        return matmul_path(self.chip, self.step.act_dtype, self.step.weight_dtype).compute_dtype

    @property
    def mbu_at_floor(self) -> float:
        """HBM bytes moved / (floor x peak HBM bandwidth), per chip."""
        return self.hbm_bytes / (self.floor_s * self.chip.memory.hbm_bw_bytes_per_s_per_chip)

    @property
    def mfu_at_floor(self) -> float:
        """Useful FLOPs / (floor x peak matmul rate of the compute dtype), per chip."""
        return self.useful_flops / (self.floor_s * self.chip.matmul_rate(self.compute_dtype))

    def share(self, op: StepOp) -> float:
        return op.floor_s / self.floor_s


def predict_step(cfg: ModelConfig, step: Step, chip: Any, *,
                 hbm_utilization: float = kvcache.DEFAULT_HBM_UTILIZATION) -> StepPrediction:
    """Compose and evaluate one step of cfg on chip (see the module docstring)."""
    ops = tuple(step_ops(cfg, step, chip))
    r = routing(step.tokens, cfg.moe.num_experts, cfg.moe.experts_per_token) if cfg.moe else None
    return StepPrediction(model=cfg, chip=chip, step=step, ops=ops,
                          memory=memory_fit(cfg, step, chip, hbm_utilization=hbm_utilization), routing=r)


def prediction_record(p: StepPrediction) -> dict[str, Any]:
    """JSON-ready summary of a prediction (the CLI's `json`)."""
    mem = p.memory
    return {
        "model": p.model.name,
        "chip": p.chip.name,
        "step": to_jsonable(p.step),
        "floor_s": p.floor_s,
        "expected_s": p.expected_s,
        "no_overlap_s": p.no_overlap_s,
        "overlapped_floor_s": p.overlapped_floor_s,
        "unit_s": p.unit_s,
        "bound": p.bound,
        "bound_shares": p.bound_shares,
        "tokens_per_step": p.tokens_per_step,
        "tokens_per_s": p.tokens_per_s,
        "tokens_per_s_per_chip": p.tokens_per_s_per_chip,
        "tokens_per_s_at_floor": p.tokens_per_s_at_floor,
        "tokens_per_s_per_chip_at_floor": p.tokens_per_s_per_chip_at_floor,
        "compute_dtype": p.compute_dtype,
        "mbu_at_floor": p.mbu_at_floor,
        "mfu_at_floor": p.mfu_at_floor,
        "hbm_bytes": p.hbm_bytes,
        "useful_flops": p.useful_flops,
        "ici_bytes": p.ici_bytes,
        "memory": to_jsonable(mem),
        "routing": to_jsonable(p.routing) if p.routing else None,
        "ops": [
            {"name": op.name, "block": op.block, "count": op.count, "floor_s": op.floor_s,
             "expected_s": op.expected_s, "bound": op.bound, "share": p.share(op), "hbm_bytes": op.hbm_bytes,
             "useful_flops": op.useful_flops, "ici_bytes": op.ici_bytes, "mxu_dtype": op.cost.mxu_dtype,
             "notes": list(op.cost.notes)}
            for op in p.ops
        ],
    }
