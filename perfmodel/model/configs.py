"""Transformer model configurations: presets and Hugging Face ``config.json`` files.

A :class:`ModelConfig` holds what the step model needs to count work and bytes:
layer and head counts, widths, vocabulary, the MLP or MoE layout, MLA (latent
attention) widths and the sliding-window layout. Presets live in
``perfmodel/data/models/*.yaml``, one file per model, every number with a
source; they are read only when asked for (nothing happens at import time).

Any other model comes from a local Hugging Face ``config.json`` path
(:func:`load_hf_config`; no network). A field the model needs that is not in
the file is a one-line :class:`InputError` naming the field and the file.

Counts (``hidden_size``, ``num_layers``...) are plain numbers of elements or
layers; nothing here carries a physical unit.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perfmodel.errors import InputError, SpecError
from perfmodel.inputcheck import MAX_DIMENSION, read_text, short

#: MLP activations the model knows: silu, gelu_tanh (tanh-approximated GELU), gelu (erf GELU, costed as the
#: tanh form's VPU/EUP work) and relu. Gated MLPs (``mlp_gated``): act(x W_gate) * (x W_up), then W_down
#: (SwiGLU for silu, GeGLU for gelu); non-gated: act(x W_up), then W_down.
MLP_ACTIVATIONS: tuple[str, ...] = ("silu", "gelu_tanh", "gelu", "relu")
#: Activations a gated MLP may use (there is no ReGLU kernel model).
GATED_ACTIVATIONS: tuple[str, ...] = ("silu", "gelu_tanh", "gelu")
#: Hugging Face ``model_type`` families by MLP layout (the config.json does not say; the modelling code does).
HF_GATED_FAMILIES = frozenset({
    "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "gemma", "gemma2", "gemma3",
    "gemma3_text", "deepseek_v2", "deepseek_v3", "phi3", "olmo", "olmo2", "granite", "cohere", "internlm2"})
HF_NON_GATED_FAMILIES = frozenset({
    "gpt2", "gpt_neox", "gptj", "opt", "falcon", "phi", "starcoder2", "gpt_bigcode", "bloom", "mpt"})
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


# --------------------------------------------------------------------------- presets


def normalize(name: str) -> str:
    """Case-, space- and underscore-insensitive key for a model name."""
    return "-".join(name.strip().lower().replace("_", " ").split())


def presets_dir() -> Path:
    return Path(__file__).resolve().parent.parent / "data" / "models"


def _load_checked(file: Path, text: str | None = None) -> ModelConfig:
    from perfmodel.hw.loader import load_yaml_file

    return validate(load_yaml_file(file, ModelConfig, text), str(file))


@functools.lru_cache(maxsize=None)
def load_model_yaml(path: str) -> ModelConfig:
    """Load and validate one preset file (cached by path; a built-in preset also on disk, see
    :func:`perfmodel.hw.speccache.load_cached`: used only for the same YAML text and loading code)."""
    file = Path(path)
    if file.parent == presets_dir():
        from perfmodel.hw.speccache import load_cached

        return load_cached(file, ModelConfig, lambda text: _load_checked(file, text), code=(__file__,))
    return _load_checked(file)


def all_presets() -> list[ModelConfig]:
    """Every built-in model, sorted by name."""
    return sorted((load_model_yaml(str(f)) for f in sorted(presets_dir().glob("*.yaml"))), key=lambda c: c.name)


#: Top-level keys holding a preset's names, as perfmodel.hw.loader.scan_header reads them.
_NAME_KEYS: dict[str, type] = {"name": str, "display_name": str, "aliases": tuple}


@functools.lru_cache(maxsize=256)
def _scan_preset(path: str, mtime_ns: int, size: int) -> tuple[tuple[str, ...], frozenset[str]] | None:
    """((name, display_name, *aliases), their normalized forms) of one preset from the file's first lines
    (no YAML parse), or None when the scan is unsure. Keyed by mtime and size too, so an edited file is
    scanned again."""
    from perfmodel.hw.speccache import scan_names

    return scan_names(path, _NAME_KEYS, lambda h: (h["name"], h["display_name"], *h["aliases"]), normalize)


def _find_preset(key: str) -> ModelConfig | None:
    """The preset get_model() would pick for ``key`` (same order as all_presets()), loading only its file;
    None when a file's head cannot be scanned, nothing matches, or the loaded preset's names are not what
    the scan read (the caller then loads every preset)."""
    from perfmodel.hw.speccache import scan_heads

    heads = scan_heads(sorted(presets_dir().glob("*.yaml")), _scan_preset)
    if heads is None:
        return None
    for f, names, keys in sorted(heads, key=lambda h: h[1][0]):
        if key in keys:
            cfg = load_model_yaml(str(f))
            return cfg if (cfg.name, cfg.display_name, *cfg.aliases) == names else None
    return None


def get_model(name_or_path: str) -> ModelConfig:
    """A preset by name or alias, a model YAML file, or a Hugging Face config.json path."""
    text = str(name_or_path)
    path = Path(text)
    if text.endswith((".json", ".yaml", ".yml")) or "/" in text or path.is_dir():
        if path.is_dir():
            path = path / "config.json"
        if not path.is_file():
            raise InputError(f"model config '{path}' does not exist; pass a preset name or a config.json path")
        if path.suffix in (".yaml", ".yml"):
            return load_model_yaml(str(path.resolve()))
        return load_hf_config(path)
    key = normalize(text)
    found = _find_preset(key)
    if found is not None:
        return found
    presets = all_presets()
    for cfg in presets:
        if key in {normalize(n) for n in (cfg.name, cfg.display_name, *cfg.aliases)}:
            return cfg
    import difflib

    names = {normalize(n): cfg.name for cfg in presets for n in (cfg.name, cfg.display_name, *cfg.aliases)}
    close = sorted({names[m] for m in difflib.get_close_matches(key, list(names), n=3, cutoff=0.6)})
    hint = f"did you mean {', '.join(close)}? " if close else ""
    known = ", ".join(cfg.name for cfg in presets)
    raise InputError(f"unknown model '{text}'; {hint}known models: {known} (or pass `config` PATH/config.json)")


# --------------------------------------------------------------------------- Hugging Face config.json


class _HFReader:
    """Reads fields of one config.json, naming file and field when one is missing or wrong."""

    def __init__(self, data: dict, file: Path, prefix: str = ""):
        self.data, self.file, self.prefix = data, file, prefix

    def has(self, key: str) -> bool:
        return self.data.get(key) is not None

    def _bad(self, key: str, msg: str) -> InputError:
        return InputError(f"{self.file}: field '{self.prefix}{key}' {msg}")

    def int(self, key: str, default: int | None = None, *, allow_zero: bool = False) -> int:
        value = self.data.get(key)
        if value is None:
            if default is not None:
                return default
            raise self._bad(key, "is missing; the model needs it (add it to the file)")
        if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
                or value != int(value)):
            raise self._bad(key, f"must be a whole number, got {short(repr(value), 40)}")
        if value > MAX_DIMENSION:
            raise self._bad(key, f"is {short(value, 40)}: larger than 2**53; no model is that large")
        if value < 0 or (value == 0 and not allow_zero):
            raise self._bad(key, f"must be positive, got {short(repr(value), 40)}")
        return int(value)

    def opt_int(self, key: str) -> int | None:
        return self.int(key) if self.has(key) else None

    def float(self, key: str) -> float | None:
        value = self.data.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self._bad(key, f"must be a number, got {short(repr(value), 40)}")
        if not math.isfinite(value):
            raise self._bad(key, f"must be a finite number, got {value!r}")
        return float(value)

    def bool(self, key: str, default: bool) -> bool:
        value = self.data.get(key, default)
        if not isinstance(value, bool):
            raise self._bad(key, f"must be true or false, got {value!r}")
        return value

    def str(self, key: str, default: str) -> str:
        value = self.data.get(key, default)
        if not isinstance(value, str):
            raise self._bad(key, f"must be a string, got {short(repr(value), 40)}")
        return value


def _read_json(file: Path) -> dict:
    text = read_text(file)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"{file}:{exc.lineno}: malformed JSON: {exc.msg}") from None
    if not isinstance(data, dict):
        raise InputError(f"{file}: expected a JSON object of config fields")
    return data


_ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_new": "gelu_tanh",
                "gelu_fast": "gelu_tanh", "gelu": "gelu", "relu": "relu"}


def _hf_mlp_gated(r: _HFReader, family: str, model_type: str) -> bool:
    """Whether the MLP is gated: an explicit ``mlp_gated`` in the file, else from the model family."""
    if r.has("mlp_gated"):
        return r.bool("mlp_gated", True)
    if family in HF_GATED_FAMILIES or model_type in HF_GATED_FAMILIES:
        return True
    if family in HF_NON_GATED_FAMILIES or model_type in HF_NON_GATED_FAMILIES:
        return False
    raise InputError(f"{r.file}: field '{r.prefix}model_type' is '{model_type}', whose MLP layout perfmodel does not "
                     f"know; add \"mlp_gated\": true (gate, up, down) or false (up, down) to the file")


def _hf_refuse_unmodelled(r: _HFReader) -> None:
    """Fields the step model cannot honour: one-line errors, never a silent substitute."""
    for key in ("layer_norm_eps", "layer_norm_epsilon", "norm_epsilon"):
        if r.has(key) and not r.has("rms_norm_eps"):
            raise InputError(f"{r.file}: field '{r.prefix}{key}': LayerNorm is not modelled (only RMSNorm); "
                             "perfmodel cannot predict this model")
    for key in ("attention_bias", "use_qkv_bias"):
        if r.data.get(key) is True:
            raise InputError(f"{r.file}: field '{r.prefix}{key}' is true: attention projection biases are not "
                             "modelled (MLP biases are: 'mlp_bias')")
    if r.data.get("parallel_attn") is True or r.data.get("use_parallel_residual") is True:
        key = "parallel_attn" if r.data.get("parallel_attn") is True else "use_parallel_residual"
        raise InputError(f"{r.file}: field '{r.prefix}{key}' is true: parallel attention + MLP blocks are not "
                         "modelled (the step model runs them one after the other)")


def _hf_moe(r: _HFReader, num_layers: int) -> MoEConfig | None:
    """The MoE layout from Mixtral-, Qwen-MoE- or DeepSeek-style fields (None for a dense model)."""
    experts_key = next((k for k in ("num_local_experts", "n_routed_experts", "num_experts") if r.has(k)), None)
    if experts_key is None or r.int(experts_key, allow_zero=True) == 0:
        return None
    num_experts = r.int(experts_key)
    top_k = r.int("num_experts_per_tok")
    expert_inter = r.int("moe_intermediate_size") if r.has("moe_intermediate_size") else r.int("intermediate_size")
    shared: int | None = None
    if r.has("n_shared_experts"):
        shared = r.int("n_shared_experts", allow_zero=True) * expert_inter or None
    elif r.has("shared_expert_intermediate_size"):
        shared = r.int("shared_expert_intermediate_size", allow_zero=True) or None
    if r.has("first_k_dense_replace") or r.has("moe_layer_freq"):  # DeepSeek
        first = r.int("first_k_dense_replace", 0, allow_zero=True)
        freq = r.int("moe_layer_freq", 1)
        moe_layers = sum(1 for i in range(num_layers) if i >= first and i % freq == 0)
    else:  # Mixtral / Qwen-MoE
        step = r.int("decoder_sparse_step", 1)
        dense_only = set(r.data.get("mlp_only_layers") or [])
        moe_layers = sum(1 for i in range(num_layers) if i not in dense_only and (i + 1) % step == 0)
    if moe_layers == 0:
        return None
    return MoEConfig(num_experts=num_experts, experts_per_token=top_k, expert_intermediate_size=expert_inter,
                     shared_expert_intermediate_size=shared, num_moe_layers=moe_layers)


def _hf_sliding(r: _HFReader, num_layers: int) -> tuple[int | None, int | None]:
    """(window, number of sliding layers) from Gemma-, Mistral- or Qwen-style fields."""
    window = r.opt_int("sliding_window")
    if window is None or r.data.get("use_sliding_window") is False:
        return None, None
    layer_types = r.data.get("layer_types")
    if isinstance(layer_types, list) and layer_types:
        count = sum(1 for t in layer_types if t == "sliding_attention")
        return (window, count) if count else (None, None)
    pattern_key = next((k for k in ("sliding_window_pattern", "_sliding_window_pattern") if r.has(k)), None)
    if pattern_key is not None:  # every pattern-th layer is global
        pattern = r.int(pattern_key)
        count = sum(1 for i in range(num_layers) if (i + 1) % pattern)
        return (window, count) if count else (None, None)
    return window, num_layers


def load_hf_config(file: Path) -> ModelConfig:
    """Build a ModelConfig from a local Hugging Face config.json (multimodal: its text_config)."""
    file = Path(file)
    data = _read_json(file)
    top = _HFReader(data, file)
    prefix = ""
    if isinstance(data.get("text_config"), dict):
        data = {**data["text_config"]}
        prefix = "text_config."
    r = _HFReader(data, file, prefix)
    model_type = r.str("model_type", top.str("model_type", "unknown"))
    hidden = r.int("hidden_size")
    layers = r.int("num_hidden_layers")
    q_heads = r.int("num_attention_heads")
    kv_heads = r.int("num_key_value_heads", q_heads)
    if q_heads % kv_heads:
        raise InputError(f"{file}: field '{prefix}num_key_value_heads' ({kv_heads}) must divide "
                         f"'{prefix}num_attention_heads' ({q_heads}); GQA needs a whole number of q heads per kv head")
    mla: MLAConfig | None = None
    if r.has("kv_lora_rank"):
        mla = MLAConfig(kv_lora_rank=r.int("kv_lora_rank"), q_lora_rank=r.opt_int("q_lora_rank"),
                        qk_nope_head_dim=r.int("qk_nope_head_dim"), qk_rope_head_dim=r.int("qk_rope_head_dim"),
                        v_head_dim=r.int("v_head_dim"))
        head_dim = mla.qk_nope_head_dim + mla.qk_rope_head_dim
        kv_heads = q_heads  # MLA expands the latent to every head; the cache holds one latent per token
    else:
        if not r.has("head_dim") and hidden % q_heads:
            raise InputError(f"{file}: field '{prefix}hidden_size' ({hidden}) is not a multiple of "
                             f"'{prefix}num_attention_heads' ({q_heads}); add '{prefix}head_dim' to the file")
        head_dim = r.int("head_dim", hidden // q_heads)
    moe = _hf_moe(r, layers)
    needs_dense = moe is None or moe.num_moe_layers < layers
    intermediate = r.int("intermediate_size") if needs_dense else r.opt_int("intermediate_size")
    window, sliding_layers = _hf_sliding(r, layers)
    act_name = r.str("hidden_activation", r.str("hidden_act", "silu"))
    if act_name not in _ACTIVATIONS:
        raise InputError(f"{file}: field '{prefix}hidden_act' is '{act_name}'; the model knows "
                         f"{', '.join(sorted(_ACTIVATIONS))}")
    family = model_type.split("_")[0]
    _hf_refuse_unmodelled(r)
    gated = _hf_mlp_gated(r, family, model_type)
    mlp_bias = r.bool("mlp_bias", False) or r.bool("use_bias", False)
    tie = r.bool("tie_word_embeddings", top.bool("tie_word_embeddings", True))
    name = normalize(file.parent.name or file.stem)
    cfg = ModelConfig(
        name=name,
        display_name=f"{file.parent.name or file.stem} ({model_type}, from {file.name})",
        aliases=(),
        hidden_size=hidden,
        num_layers=layers,
        num_q_heads=q_heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=intermediate,
        vocab_size=r.int("vocab_size"),
        tie_embeddings=tie,
        mlp_activation=_ACTIVATIONS[act_name],
        mlp_gated=gated,
        mlp_bias=mlp_bias,
        norm="rmsnorm",
        norms_per_layer=4 if family in ("gemma2", "gemma3") else 2,
        qk_norm=family in ("qwen3", "gemma3") or r.bool("use_qk_norm", False),
        rope_theta=r.float("rope_theta"),
        sliding_window_tokens=window,
        num_sliding_window_layers=sliding_layers,
        moe=moe,
        mla=mla,
        published_total_params=None,
        published_active_params=None,
        notes=(f"read from {file}",),
        references={"config": str(file)},
        sources={},
    )
    return validate(cfg, str(file), require_sources=False)


def describe(cfg: ModelConfig) -> str:
    """One line: the architecture at a glance."""
    parts = [f"{cfg.num_layers} layers", f"hidden {cfg.hidden_size}",
             f"{cfg.num_q_heads}q/{cfg.num_kv_heads}kv heads x {cfg.head_dim}"]
    if cfg.mla:
        parts.append(f"MLA latent {cfg.mla.kv_lora_rank}+{cfg.mla.qk_rope_head_dim}")
    if cfg.moe:
        parts.append(f"MoE {cfg.moe.experts_per_token}/{cfg.moe.num_experts} experts x "
                     f"{cfg.moe.expert_intermediate_size} on {cfg.moe.num_moe_layers} layers")
    if cfg.num_dense_layers:
        layout = ("gated " if cfg.mlp_gated else "") + cfg.mlp_activation + (" +bias" if cfg.mlp_bias else "")
        parts.append(f"dense MLP {cfg.intermediate_size} ({layout})")
    if cfg.sliding_window_tokens:
        parts.append(f"{cfg.num_sliding_window_layers} sliding-window layers ({cfg.sliding_window_tokens} tokens)")
    parts.append(f"vocab {cfg.vocab_size}")
    return ", ".join(parts)
