"""One transformer step (a prefill chunk or a decode step) composed from the op models.

:func:`predict_step` lists the ops one chip runs in one step of a model
(:class:`~perfmodel.model.schema.ModelConfig`), evaluates each on a chip
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
expected times. Tensor parallelism (``tp`` chips over ICI) splits the model
as :mod:`perfmodel.model.sharding` lays it out (Megatron); two all-reduces
per layer. The step's inputs are a :class:`~perfmodel.model.step.Step`.

MoE routing is modelled as uniform: a step of T tokens with top-k of E
experts touches ``E * (1 - (1 - k/E)^T)`` experts (expected distinct
count), each receiving ``T*k / touched`` tokens (the mean over all experts
is ``T*k/E``); only touched experts' weights are read.

No jax import here.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from perfmodel.errors import InputError
from perfmodel.model import attention, collectives, core, fused, kvcache, memops, paged_attention, sampling
from perfmodel.model.core import UNITS, OpCost, Roofline, evaluate
from perfmodel.model.dtypes import DTYPES, default_kv_scale, matmul_path
from perfmodel.model.gemm import gemm, grouped_gemm, uniform_group_sizes
from perfmodel.model.schema import ModelConfig
from perfmodel.model.sharding import MemoryFit, Shard, memory_fit, mlp_input_name, shard, weight_matrix
from perfmodel.model.step import MIXED, Step

#: Logits are upcast to f32 before sampling (as vLLM's samplers do).
LOGITS_DTYPE = "fp32"
#: Router top-k selection per (token, expert) score: sigmoid/softmax (3 VPU + 1 EUP), then k rounds of
#: compare + select value + select index.
ROUTER_SCORE_VPU_OPS, ROUTER_SCORE_EUP_OPS, ROUTER_TOPK_VPU_OPS_PER_ROUND = 3, 1, 3
#: Combining expert outputs: one multiply-add per (token, expert, hidden) element.
MOE_COMBINE_VPU_OPS = 2
#: MLP activation (schema.MLP_ACTIVATIONS) -> the elementwise cost it takes (perfmodel.model.elementwise.EPILOGUES;
#: erf GELU is costed as the tanh form) and, gated, the fused GLU kind (perfmodel.model.fused.GLU_KINDS).
MLP_EPILOGUE = {"silu": "silu", "gelu_tanh": "gelu", "gelu": "gelu", "relu": "relu"}
GLU_KIND = {"silu": "swiglu", "gelu_tanh": "geglu", "gelu": "geglu"}


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


def _proj(cfg: ModelConfig, sh: Shard, name: str, m: int, step: Step, chip: Any,
          epilogue: tuple[str, ...] = ()) -> OpCost:
    """[m, k] x [k, n] projection by the weight matrix ``name`` (:func:`~perfmodel.model.sharding.weight_matrix`)
    with the step's activation and weight dtypes (and a fused epilogue)."""
    mat = weight_matrix(cfg, sh, name)
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


@dataclass(frozen=True, kw_only=True)
class _OpRow:
    """One op of the step before it is evaluated: what the op builders return and :func:`step_ops` evaluates."""

    #: The :attr:`StepOp.block` it belongs to.
    block: str
    name: str
    #: Instances per step (layers of its kind; 0: the op is left out).
    count: int
    cost: OpCost


def _attention_ops(cfg: ModelConfig, sh: Shard, step: Step, chip: Any) -> list[_OpRow]:
    """The ops of one attention block, for every layer (its all-reduce under TP in block "tp")."""
    L, T, act = cfg.num_layers, step.tokens, step.act_dtype
    h = cfg.hidden_size
    ops = [_OpRow(block="attention", name="attn_norm", count=L,
                  cost=fused.rms_norm(tokens=T, hidden=h, dtype=act, residual=True, chip=chip))]
    kv_scale = default_kv_scale(step.kv_dtype)
    if cfg.mla is None:
        ops.append(_OpRow(block="attention", name="qkv_proj", count=L,
                          cost=_proj(cfg, sh, "qkv_proj", T, step, chip)))
        if cfg.qk_norm:
            ops.append(_OpRow(block="attention", name="qk_norm", count=L, cost=fused.rms_norm(
                tokens=T * (sh.q_heads + sh.kv_heads), hidden=cfg.head_dim, dtype=act, residual=False, chip=chip)))
        ops.append(_OpRow(block="attention", name="rope", count=L, cost=fused.rope(
            tokens=T, heads=sh.q_heads + sh.kv_heads, head_dim=cfg.head_dim, dtype=act, chip=chip)))
        ops.append(_OpRow(block="attention", name="kv_write", count=L, cost=kvcache.kv_cache_update(
            num_tokens=T, kv_heads=sh.kv_heads, head_dim=cfg.head_dim, page_size=step.page_size,
            kv_dtype=step.kv_dtype, src_dtype=act, kv_scale=kv_scale, chip=chip)))
        for label, layers, window in _attention_kinds(cfg):
            if step.phase == MIXED:
                q_lens, lens = ragged_lens(step, window)
                cost = paged_attention.ragged_paged_attention(
                    query_lens=q_lens, context_lens=lens, q_heads=sh.q_heads, kv_heads=sh.kv_heads,
                    head_dim=cfg.head_dim, page_size=step.page_size, kv_dtype=step.kv_dtype, q_dtype=act,
                    kv_scale=kv_scale, chip=chip)
            elif step.phase == "decode":
                lens, batch = _decode_lens(step, window)
                cost = paged_attention.paged_decode_attention(
                    context_lens=lens, batch=batch, q_heads=sh.q_heads, kv_heads=sh.kv_heads, head_dim=cfg.head_dim,
                    page_size=step.page_size, kv_dtype=step.kv_dtype, q_dtype=act, kv_scale=kv_scale, chip=chip)
            else:
                cost = attention.flash_attention(
                    batch=step.batch, q_len=step.chunk_tokens, kv_len=step.kv_tokens, q_heads=sh.q_heads,
                    kv_heads=sh.kv_heads, head_dim=cfg.head_dim, causal=True, sliding_window=window, dtype=act,
                    chip=chip)
            ops.append(_OpRow(block="attention", name=label, count=layers, cost=cost))
        ops.append(_OpRow(block="attention", name="o_proj", count=L, cost=_proj(cfg, sh, "o_proj", T, step, chip)))
    else:
        ops += _mla_ops(cfg, sh, step, chip)
    if sh.tp > 1:
        ops.append(_OpRow(block="tp", name="all_reduce(attn)", count=L, cost=collectives.all_reduce(
            bytes_per_chip=T * h * DTYPES[act].itemsize_bytes, num_chips=sh.tp, chip=chip)))
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
        return [(label, layers, paged_attention.ragged_paged_attention(
            query_lens=q, context_lens=window_lens(q, c, window), q_heads=sh.q_heads,
            kv_heads=sh.kv_heads, head_dim=cfg.head_dim, page_size=step.page_size, kv_dtype=step.kv_dtype,
            q_dtype=act, kv_scale=kv_scale, chip=chip)) for label, layers, window in _attention_kinds(cfg)]
    m, L = cfg.mla, cfg.num_layers
    if np.all(q == 1):
        return [("mla_attention", L, paged_attention.mla_decode(
            context_lens=c, batch=None, q_heads=sh.q_heads, page_size=step.page_size, kv_lora_rank=m.kv_lora_rank,
            rope_head_dim=m.qk_rope_head_dim, kv_dtype=step.kv_dtype, q_dtype=act, chip=chip))]
    if np.any(q == 1):
        raise InputError("`query_lens`: MLA prices decode tokens and prefill chunks in two calls; give all 1 or "
                         "all above 1")
    return [(r.name, r.count, r.cost)
            for r in _mla_expanded(cfg, sh, step, chip, batch=1, q_len=q[:, 0], kv_len=c[:, 0])]


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


def _mla_ops(cfg: ModelConfig, sh: Shard, step: Step, chip: Any) -> list[_OpRow]:
    """Latent attention: down projections, latent norms, rope, latent cache write, attention, up / out projections."""
    m, L, T, act = cfg.mla, cfg.num_layers, step.tokens, step.act_dtype
    latent = m.kv_lora_rank + m.qk_rope_head_dim
    kv_scale = default_kv_scale(step.kv_dtype)
    if m.q_lora_rank is None:
        ops = [_OpRow(block="attention", name="q_proj", count=L, cost=_proj(cfg, sh, "q_proj", T, step, chip)),
               _OpRow(block="attention", name="kv_down", count=L, cost=_proj(cfg, sh, "kv_down", T, step, chip)),
               _OpRow(block="attention", name="latent_norm", count=L, cost=fused.rms_norm(
                   tokens=T, hidden=m.kv_lora_rank, dtype=act, residual=False, chip=chip))]
    else:
        ops = [_OpRow(block="attention", name="qkv_down", count=L, cost=_proj(cfg, sh, "qkv_down", T, step, chip)),
               _OpRow(block="attention", name="latent_norms", count=L, cost=fused.rms_norm(
                   tokens=T, hidden=m.q_lora_rank + m.kv_lora_rank, dtype=act, residual=False, chip=chip)),
               _OpRow(block="attention", name="q_up", count=L, cost=_proj(cfg, sh, "q_up", T, step, chip))]
    ops.append(_OpRow(block="attention", name="rope", count=L, cost=fused.rope(
        tokens=T, heads=sh.q_heads + 1, head_dim=m.qk_rope_head_dim, dtype=act, chip=chip)))
    # kv_cache_update writes K and V rows of head_dim each; MLA writes one latent row of `latent` values:
    # the same bytes as K and V rows of latent/2 (exact for even widths, e.g. DeepSeek's 576).
    ops.append(_OpRow(block="attention", name="kv_write", count=L, cost=kvcache.kv_cache_update(
        num_tokens=T, kv_heads=1, head_dim=max(latent // 2, 1), page_size=step.page_size, kv_dtype=step.kv_dtype,
        src_dtype=act, kv_scale=kv_scale, chip=chip)))
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
    ops.append(_OpRow(block="attention", name="o_proj", count=L, cost=_proj(cfg, sh, "o_proj", T, step, chip)))
    return ops


def _mla_absorbed(cfg: ModelConfig, sh: Shard, step: Step, chip: Any, *, tokens: int, context_lens: Any,
                  batch: int | None) -> list[_OpRow]:
    """MLA decode, absorbed form: q_nope x W_UK per head into latent space, attention over the latent cache,
    latent output x W_UV per head (W_UK and W_UV are the two halves of kv_up)."""
    m, L, act = cfg.mla, cfg.num_layers, step.act_dtype
    absorb = dict(batch=sh.q_heads, lhs_dtype=act, rhs_dtype=step.weight_dtype, out_dtype=act, chip=chip)
    return [
        _OpRow(block="attention", name="q_absorb", count=L, cost=_named(
            gemm(m=tokens, n=m.kv_lora_rank, k=m.qk_nope_head_dim, **absorb), "q_absorb")),
        _OpRow(block="attention", name="mla_attention", count=L, cost=paged_attention.mla_decode(
            context_lens=context_lens, batch=batch, q_heads=sh.q_heads, page_size=step.page_size,
            kv_lora_rank=m.kv_lora_rank, rope_head_dim=m.qk_rope_head_dim, kv_dtype=step.kv_dtype, q_dtype=act,
            chip=chip)),
        _OpRow(block="attention", name="v_absorb", count=L, cost=_named(
            gemm(m=tokens, n=m.v_head_dim, k=m.kv_lora_rank, **absorb), "v_absorb")),
    ]


def _mla_expanded(cfg: ModelConfig, sh: Shard, step: Step, chip: Any, *, batch: int, q_len: int,
                  kv_len: int) -> list[_OpRow]:
    """MLA prefill: expand every cached and new latent to per-head K_nope and V, then flash attention with the
    192-wide query/key heads (V is 128 wide: the PV product is over-counted by 192/128)."""
    L = cfg.num_layers
    return [
        _OpRow(block="attention", name="kv_up", count=L, cost=_proj(cfg, sh, "kv_up", batch * kv_len, step, chip)),
        _OpRow(block="attention", name="attention", count=L, cost=attention.flash_attention(
            batch=batch, q_len=q_len, kv_len=kv_len, q_heads=sh.q_heads, kv_heads=sh.q_heads, head_dim=cfg.head_dim,
            causal=True, dtype=step.act_dtype, chip=chip)),
    ]


def _mlp_ops(cfg: ModelConfig, sh: Shard, step: Step, chip: Any) -> list[_OpRow]:
    """The ops of the MLP / MoE half of every layer (blocks "mlp", "moe" and, under TP, "tp")."""
    T, act, h = step.tokens, step.act_dtype, cfg.hidden_size
    # A non-gated MLP's activation rides on the up projection's epilogue (XLA fuses it); a gated one is its own
    # fused GLU kernel over the gate and up halves. Biases are epilogues of the projections.
    glu = GLU_KIND.get(cfg.mlp_activation) if cfg.mlp_gated else None
    bias = ("bias",) if cfg.mlp_bias else ()
    ops = [_OpRow(block="mlp", name="mlp_norm", count=cfg.num_layers,
                  cost=fused.rms_norm(tokens=T, hidden=h, dtype=act, residual=True, chip=chip))]
    nd = cfg.num_dense_layers
    if nd:
        up = mlp_input_name(cfg)
        if glu is None:
            ops.append(_OpRow(block="mlp", name=up, count=nd, cost=_proj(
                cfg, sh, up, T, step, chip, epilogue=bias + (MLP_EPILOGUE[cfg.mlp_activation],))))
        else:
            ops += [_OpRow(block="mlp", name=up, count=nd, cost=_proj(cfg, sh, up, T, step, chip, epilogue=bias)),
                    _OpRow(block="mlp", name=glu, count=nd, cost=fused.glu(
                        tokens=T, intermediate=sh.intermediate, dtype=act, kind=glu, chip=chip))]
        ops.append(_OpRow(block="mlp", name="down", count=nd,
                          cost=_proj(cfg, sh, "down", T, step, chip, epilogue=bias)))
    if cfg.moe is not None:
        ops += _moe_ops(cfg, sh, step, chip, glu)
    if sh.tp > 1:
        ops.append(_OpRow(block="tp", name="all_reduce(mlp)", count=cfg.num_layers, cost=collectives.all_reduce(
            bytes_per_chip=T * h * DTYPES[act].itemsize_bytes, num_chips=sh.tp, chip=chip)))
    return ops


def _moe_ops(cfg: ModelConfig, sh: Shard, step: Step, chip: Any, glu: str | None) -> list[_OpRow]:
    """The ops of every MoE layer: router and top-k, dispatch, routed and shared experts, combine."""
    T, act, h = step.tokens, step.act_dtype, cfg.hidden_size
    moe, nm = cfg.moe, cfg.moe.num_moe_layers
    r = routing(T, moe.num_experts, moe.experts_per_token)
    item = DTYPES[act].itemsize_bytes
    scores = T * moe.num_experts
    topk = _local("topk", vpu=scores * (ROUTER_SCORE_VPU_OPS + ROUTER_TOPK_VPU_OPS_PER_ROUND * moe.experts_per_token),
                  eup=scores * ROUTER_SCORE_EUP_OPS, read=scores * item, write=T * moe.experts_per_token * 8)
    router = _proj(cfg, sh, "router", T, step, chip)
    gate_up, down = weight_matrix(cfg, sh, "experts_gate_up"), weight_matrix(cfg, sh, "experts_down")
    ops = [
        _OpRow(block="moe", name="router+topk", count=nm,
               cost=_sum([router, dataclasses.replace(topk, mxu_dtype=router.mxu_dtype)])),
        _OpRow(block="moe", name="dispatch", count=nm, cost=_local(
            "dispatch", read=T * h * item, write=r.assignments * h * item,
            notes=("tokens gathered into expert order (one row per token-expert assignment)",))),
        _OpRow(block="moe", name="experts_gate_up", count=nm, cost=_expert_gemm(
            "experts_gate_up", r, n=gate_up.n, k=gate_up.k, step=step, chip=chip)),
        _OpRow(block="moe", name=f"experts_{glu}", count=nm, cost=fused.glu(
            tokens=r.assignments, intermediate=sh.expert_intermediate, dtype=act, kind=glu, chip=chip)),
        _OpRow(block="moe", name="experts_down", count=nm,
               cost=_expert_gemm("experts_down", r, n=down.n, k=down.k, step=step, chip=chip)),
    ]
    if sh.shared_intermediate:
        ops += [
            _OpRow(block="moe", name="shared_gate_up", count=nm, cost=_proj(cfg, sh, "shared_gate_up", T, step, chip)),
            _OpRow(block="moe", name=f"shared_{glu}", count=nm, cost=fused.glu(
                tokens=T, intermediate=sh.shared_intermediate, dtype=act, kind=glu, chip=chip)),
            _OpRow(block="moe", name="shared_down", count=nm, cost=_proj(cfg, sh, "shared_down", T, step, chip)),
        ]
    ops.append(_OpRow(block="moe", name="combine", count=nm, cost=_local(
        "combine", vpu=r.assignments * h * MOE_COMBINE_VPU_OPS, read=r.assignments * h * item,
        write=T * h * item, notes=("expert outputs weighted and summed back into token order",))))
    return ops


def _head_ops(cfg: ModelConfig, sh: Shard, step: Step, chip: Any) -> list[_OpRow]:
    """Embedding lookup (and its all-reduce under TP), final norm, vocab projection, logits all-gather, sampling."""
    T, B, act, h = step.tokens, step.batch, step.act_dtype, cfg.hidden_size
    act_item, w_item = DTYPES[act].itemsize_bytes, DTYPES[step.weight_dtype].itemsize_bytes
    ops = [_OpRow(block="embed", name="embed", count=1,
                  cost=_named(memops.gather(rows=T, row_bytes=h * w_item, chip=chip), "embed"))]
    if sh.tp > 1:  # the table is split by vocabulary: each chip looks up its rows (zeros elsewhere), then all-reduce
        ops.append(_OpRow(block="tp", name="all_reduce(embed)", count=1, cost=collectives.all_reduce(
            bytes_per_chip=T * h * act_item, num_chips=sh.tp, chip=chip)))
    ops.append(_OpRow(block="head", name="final_norm", count=1,
                      cost=fused.rms_norm(tokens=T, hidden=h, dtype=act, residual=True, chip=chip)))
    # [B, hidden] x [hidden, vocab / tp] for the last token of each sequence (a tied head reads the embedding table)
    ops.append(_OpRow(block="head", name="lm_head", count=1, cost=_named(
        gemm(m=B, n=sh.vocab, k=h, chip=chip, **{**step.weight_gemm(), "out_dtype": LOGITS_DTYPE}), "lm_head")))
    if sh.tp > 1:
        ops.append(_OpRow(block="tp", name="all_gather(logits)", count=1, cost=collectives.all_gather(
            bytes_per_chip=B * sh.vocab * DTYPES[LOGITS_DTYPE].itemsize_bytes, num_chips=sh.tp, chip=chip)))
    ops.append(_OpRow(block="head", name="sampling", count=1, cost=sampling.sampling(
        batch=B, vocab=cfg.vocab_size, dtype=LOGITS_DTYPE, temperature=True, chip=chip)))
    return ops


def step_ops(cfg: ModelConfig, step: Step, chip: Any) -> list[StepOp]:
    """Every op of the step, in execution order, evaluated on chip (one instance; ``count`` = layers)."""
    sh = shard(cfg, step.tp)
    head = _head_ops(cfg, sh, step, chip)
    embed = [r for r in head if r.block == "embed" or r.name == "all_reduce(embed)"]
    rows = embed + _attention_ops(cfg, sh, step, chip) + _mlp_ops(cfg, sh, step, chip) + head[len(embed):]
    return [StepOp(name=r.name, block=r.block, count=r.count, cost=_named(r.cost, r.name),
                   roofline=evaluate(r.cost, chip)) for r in rows if r.count]


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
