"""Model configurations from local Hugging Face ``config.json`` files (:func:`load_hf_config`; no network).

A field the model needs that is not in the file is a one-line :class:`InputError`
naming the field and the file; a field the step model cannot honour (LayerNorm,
attention biases, parallel blocks) is refused the same way.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from perfmodel.errors import InputError
from perfmodel.inputcheck import MAX_DIMENSION, read_text, short
from perfmodel.model.configs import normalize
from perfmodel.model.schema import MLAConfig, ModelConfig, MoEConfig, validate

#: Hugging Face ``model_type`` families by MLP layout (the config.json does not say; the modelling code does).
HF_GATED_FAMILIES = frozenset({
    "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "gemma", "gemma2", "gemma3",
    "gemma3_text", "deepseek_v2", "deepseek_v3", "phi3", "olmo", "olmo2", "granite", "cohere", "internlm2"})
HF_NON_GATED_FAMILIES = frozenset({
    "gpt2", "gpt_neox", "gptj", "opt", "falcon", "phi", "starcoder2", "gpt_bigcode", "bloom", "mpt"})


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
