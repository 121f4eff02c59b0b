"""The transformer model schema: :class:`ModelConfig` and its parts, parameter counts and the cross-field checks.

A :class:`ModelConfig` holds what the step model needs to count work and bytes:
layer and head counts, widths, vocabulary, the MLP or MoE layout, MLA (latent
attention) widths and the sliding-window layout. The presets and the name lookup
are in :mod:`perfmodel.model.configs`, the Hugging Face ``config.json`` reader in
:mod:`perfmodel.model.hf_config`; both build a ModelConfig and check it with :func:`validate`.

Counts (``hidden_size``, ``num_layers``...) are plain numbers of elements or
layers; nothing here carries a physical unit.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from typing import Any

from perfmodel.errors import InputError, SpecError

#: MLP activations the model knows: silu, gelu_tanh (tanh-approximated GELU), gelu (erf GELU, costed as the
#: tanh form's VPU/EUP work) and relu. Gated MLPs (``mlp_gated``): act(x W_gate) * (x W_up), then W_down
#: (SwiGLU for silu, GeGLU for gelu); non-gated: act(x W_up), then W_down.
MLP_ACTIVATIONS: tuple[str, ...] = ("silu", "gelu_tanh", "gelu", "relu")
#: Activations a gated MLP may use (there is no ReGLU kernel model).
GATED_ACTIVATIONS: tuple[str, ...] = ("silu", "gelu_tanh", "gelu")
NORMS: tuple[str, ...] = ("rmsnorm",)


@dataclass(frozen=True, kw_only=True)
class MoEConfig:
    """Mixture-of-experts layout of the MLP blocks."""

    #: Routed experts per MoE layer.
    num_experts: int
    #: Routed experts each token goes to (top-k).
    experts_per_token: int
    #: Intermediate width of one routed expert (its gate, up and down matrices).
    expert_intermediate_size: int
    #: Total intermediate width of the always-on shared expert(s); None = no shared expert.
    #: (DeepSeek-V3: 1 shared expert x 2048.)
    shared_expert_intermediate_size: int | None
    #: Layers whose MLP is a MoE; the other layers use the dense MLP (DeepSeek-V3's first 3).
    num_moe_layers: int


@dataclass(frozen=True, kw_only=True)
class MLAConfig:
    """Multi-head latent attention (DeepSeek-V2/V3): KV is cached as one latent per token."""

    #: Width of the compressed KV latent (what the cache stores, plus the rope part).
    kv_lora_rank: int
    #: Width of the compressed query; None = queries are projected directly.
    q_lora_rank: int | None
    #: Per-head query/key width without position encoding.
    qk_nope_head_dim: int
    #: Per-head (and cached, shared) rotary width.
    qk_rope_head_dim: int
    #: Per-head value width.
    v_head_dim: int


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """One decoder-only transformer. Mirrors a YAML file in perfmodel/data/models/."""

    #: Canonical name, lower-case with dashes (e.g. "llama-3.1-8b").
    name: str
    display_name: str
    #: Other names users type.
    aliases: tuple[str, ...]
    hidden_size: int
    num_layers: int
    num_q_heads: int
    num_kv_heads: int
    #: Per-head width of q/k/v (for MLA models: qk_nope + qk_rope, the query/key width).
    head_dim: int
    #: Dense MLP intermediate width; None where every layer is a MoE layer.
    intermediate_size: int | None
    vocab_size: int
    #: Whether the output (vocab) projection shares the embedding matrix.
    tie_embeddings: bool
    #: MLP activation, one of MLP_ACTIVATIONS (gated: "silu" is SwiGLU, "gelu_tanh"/"gelu" GeGLU).
    mlp_activation: str
    #: Gated MLP (gate, up and down matrices) or not (up and down).
    mlp_gated: bool
    #: Bias vectors on the MLP's projections (and the experts').
    mlp_bias: bool
    #: "rmsnorm".
    norm: str
    #: Norm layers per block: 2 (pre-attention, pre-MLP) or 4 (Gemma's pre and post norms).
    norms_per_layer: int
    #: RMSNorm on each q and k head before RoPE (Qwen3, Gemma 3).
    qk_norm: bool
    #: RoPE base frequency (of the global layers where local ones differ); None = no RoPE.
    rope_theta: float | None
    #: Sliding-window span of the local layers; None = every layer attends to the whole context.
    sliding_window_tokens: int | None
    #: How many layers use the sliding window (the rest are global); None when there is no window.
    num_sliding_window_layers: int | None
    moe: MoEConfig | None
    mla: MLAConfig | None
    #: Parameter counts the authors publish (for the check in tests); None if not published.
    published_total_params: float | None
    published_active_params: float | None
    notes: tuple[str, ...]
    #: Reference id -> citation.
    references: dict[str, str]
    #: Dotted field path -> reference id, for every number above.
    sources: dict[str, str]

    # ----- derived conveniences -----

    @property
    def num_dense_layers(self) -> int:
        """Layers with a dense MLP."""
        return self.num_layers - (self.moe.num_moe_layers if self.moe else 0)

    @property
    def num_global_layers(self) -> int:
        """Layers attending to the whole context."""
        return self.num_layers - (self.num_sliding_window_layers or 0)

    @property
    def q_width(self) -> int:
        """Query projection width (all heads)."""
        return self.num_q_heads * self.head_dim

    @property
    def attn_out_width(self) -> int:
        """Input width of the attention output projection (all heads)."""
        return self.num_q_heads * (self.mla.v_head_dim if self.mla else self.head_dim)


@dataclass(frozen=True, kw_only=True)
class ParamCounts:
    """Parameter counts of a model (elements, not bytes)."""

    #: Input embedding table.
    embedding: int
    #: Output (vocab) projection; 0 when tied to the embedding.
    lm_head: int
    #: Attention weights of all layers (projections and their norms).
    attention: int
    #: Dense MLP weights of all dense layers.
    dense_mlp: int
    #: Routed experts of all MoE layers (all experts).
    routed_experts: int
    #: Shared experts of all MoE layers.
    shared_experts: int
    #: Routers of all MoE layers.
    routers: int
    #: Layer norms (per-layer and final).
    norms: int
    #: Routed-expert parameters one token touches (top-k of them, all MoE layers).
    routed_experts_active: int

    @property
    def total(self) -> int:
        return (self.embedding + self.lm_head + self.attention + self.dense_mlp + self.routed_experts
                + self.shared_experts + self.routers + self.norms)

    @property
    def active(self) -> int:
        """Parameters one token's forward pass reads (top-k experts only)."""
        return self.total - self.routed_experts + self.routed_experts_active


def attention_params_per_layer(cfg: ModelConfig) -> int:
    """Weights of one attention block, its q/k norms (and MLA's latent norms) included."""
    h = cfg.hidden_size
    if cfg.mla is None:
        qkv = h * (cfg.num_q_heads + 2 * cfg.num_kv_heads) * cfg.head_dim
        out = cfg.num_q_heads * cfg.head_dim * h
        qk_norms = 2 * cfg.head_dim if cfg.qk_norm else 0
        return qkv + out + qk_norms
    m = cfg.mla
    qk_head = m.qk_nope_head_dim + m.qk_rope_head_dim
    if m.q_lora_rank is None:
        q = h * cfg.num_q_heads * qk_head
    else:
        q = h * m.q_lora_rank + m.q_lora_rank + m.q_lora_rank * cfg.num_q_heads * qk_head
    kv_down = h * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank
    kv_up = m.kv_lora_rank * cfg.num_q_heads * (m.qk_nope_head_dim + m.v_head_dim)
    out = cfg.num_q_heads * m.v_head_dim * h
    return q + kv_down + kv_up + out


def mlp_params(cfg: ModelConfig, hidden: int, intermediate: int) -> int:
    """One MLP of cfg's layout: gate (when gated), up and down matrices, and their biases (when ``mlp_bias``)."""
    matrices = (3 if cfg.mlp_gated else 2) * hidden * intermediate
    biases = ((2 if cfg.mlp_gated else 1) * intermediate + hidden) if cfg.mlp_bias else 0
    return matrices + biases


def parameter_counts(cfg: ModelConfig) -> ParamCounts:
    """Count the weights of cfg from its shapes (MLP biases when ``mlp_bias``; no attention biases)."""
    h = cfg.hidden_size
    embedding = cfg.vocab_size * h
    moe = cfg.moe
    routed = shared = routers = routed_active = 0
    if moe is not None:
        one_expert = mlp_params(cfg, h, moe.expert_intermediate_size)
        routed = moe.num_moe_layers * moe.num_experts * one_expert
        routed_active = moe.num_moe_layers * moe.experts_per_token * one_expert
        if moe.shared_expert_intermediate_size:
            shared = moe.num_moe_layers * mlp_params(cfg, h, moe.shared_expert_intermediate_size)
        routers = moe.num_moe_layers * h * moe.num_experts
    dense = cfg.num_dense_layers * mlp_params(cfg, h, cfg.intermediate_size) if cfg.num_dense_layers else 0
    return ParamCounts(
        embedding=embedding,
        lm_head=0 if cfg.tie_embeddings else embedding,
        attention=cfg.num_layers * attention_params_per_layer(cfg),
        dense_mlp=dense,
        routed_experts=routed,
        shared_experts=shared,
        routers=routers,
        norms=(cfg.num_layers * cfg.norms_per_layer + 1) * h,
        routed_experts_active=routed_active,
    )


# --------------------------------------------------------------------------- validation


def _numeric_paths(cls: type = ModelConfig, prefix: str = "") -> list[str]:
    """Dotted paths of every int/float field of cls (nested dataclasses included)."""
    out: list[str] = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        args = set(typing.get_args(tp)) - {type(None)}
        inner = [a for a in args if dataclasses.is_dataclass(a)]
        if dataclasses.is_dataclass(tp) or inner:
            out.extend(_numeric_paths(inner[0] if inner else tp, f"{prefix}{f.name}."))
        elif ({tp} | args) & {int, float} and bool not in ({tp} | args):
            out.append(f"{prefix}{f.name}")
    return out


def _get(obj: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        if obj is None:
            return None
        obj = getattr(obj, part)
    return obj


def validate(cfg: ModelConfig, where: str, *, require_sources: bool = True) -> ModelConfig:
    """Cross-field checks; raise a one-line error naming ``where`` and the field."""
    err = SpecError if require_sources else InputError

    def bad(msg: str) -> Exception:
        return err(f"{where}: {msg}")

    if cfg.num_q_heads % cfg.num_kv_heads:
        raise bad(f"field 'num_kv_heads' ({cfg.num_kv_heads}) must divide 'num_q_heads' ({cfg.num_q_heads})")
    if cfg.mlp_activation not in MLP_ACTIVATIONS:
        raise bad(f"field 'mlp_activation' must be one of {', '.join(MLP_ACTIVATIONS)}, got '{cfg.mlp_activation}'")
    if cfg.mlp_gated and cfg.mlp_activation not in GATED_ACTIVATIONS:
        raise bad(f"field 'mlp_activation' '{cfg.mlp_activation}' with 'mlp_gated' true (a ReGLU-style MLP) is not "
                  f"modelled; gated MLPs take {', '.join(GATED_ACTIVATIONS)}")
    if cfg.moe is not None and not cfg.mlp_gated:
        raise bad("field 'mlp_gated' is false but the model has MoE layers; only gated experts are modelled")
    if cfg.moe is not None and cfg.mlp_bias:
        raise bad("field 'mlp_bias' is true but the model has MoE layers; expert biases are not modelled")
    if cfg.norm not in NORMS:
        raise bad(f"field 'norm' must be one of {', '.join(NORMS)}, got '{cfg.norm}'")
    if cfg.norms_per_layer not in (2, 4):
        raise bad(f"field 'norms_per_layer' must be 2 or 4, got {cfg.norms_per_layer}")
    if (cfg.sliding_window_tokens is None) != (cfg.num_sliding_window_layers is None):
        raise bad("fields 'sliding_window_tokens' and 'num_sliding_window_layers' must be both set or both null")
    if cfg.num_sliding_window_layers is not None and cfg.num_sliding_window_layers > cfg.num_layers:
        raise bad(f"field 'num_sliding_window_layers' ({cfg.num_sliding_window_layers}) exceeds "
                  f"'num_layers' ({cfg.num_layers})")
    if cfg.moe is not None:
        if cfg.moe.experts_per_token > cfg.moe.num_experts:
            raise bad(f"field 'moe.experts_per_token' ({cfg.moe.experts_per_token}) exceeds "
                      f"'moe.num_experts' ({cfg.moe.num_experts})")
        if cfg.moe.num_moe_layers > cfg.num_layers:
            raise bad(f"field 'moe.num_moe_layers' ({cfg.moe.num_moe_layers}) exceeds 'num_layers' ({cfg.num_layers})")
    if cfg.num_dense_layers and cfg.intermediate_size is None:
        raise bad(f"field 'intermediate_size' is null but {cfg.num_dense_layers} layer(s) have a dense MLP")
    if cfg.mla is not None and cfg.head_dim != cfg.mla.qk_nope_head_dim + cfg.mla.qk_rope_head_dim:
        raise bad(f"field 'head_dim' ({cfg.head_dim}) must equal mla.qk_nope_head_dim + mla.qk_rope_head_dim "
                  f"({cfg.mla.qk_nope_head_dim + cfg.mla.qk_rope_head_dim})")
    if not require_sources:
        return cfg
    for ref in set(cfg.sources.values()):
        if ref not in cfg.references:
            raise bad(f"field 'sources' names reference '{ref}' that is not in 'references'")
    numeric = _numeric_paths()
    for path in numeric:
        if _get(cfg, path) is not None and path not in cfg.sources:
            raise bad(f"field '{path}' has no entry in 'sources'; every number needs one")
    for path in cfg.sources:
        if path not in numeric:
            raise bad(f"'sources' names '{path}', which is not a numeric field")
    return cfg

