"""Model configurations: presets, strict YAML loading, Hugging Face config.json parsing."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from perfmodel.errors import InputError, SpecError
from perfmodel.model import configs, schema
from perfmodel.model.configs import get_model
from perfmodel.model.hf_config import load_hf_config
from perfmodel.model.schema import parameter_counts

PRESETS = ["llama-3.1-8b", "llama-3.1-70b", "llama-3.1-405b", "qwen3-32b", "gemma-3-27b", "mixtral-8x7b",
           "qwen3-235b-a22b", "deepseek-v3"]

#: Published parameter counts are rounded (e.g. "8B", "47B"); the model's count from the shapes must land
#: within this relative distance of them.
PARAM_TOLERANCE = 0.02


def test_every_preset_is_listed():
    assert sorted(c.name for c in configs.all_presets()) == sorted(PRESETS)


@pytest.mark.parametrize("name", PRESETS)
def test_preset_param_count_matches_published(name):
    cfg = get_model(name)
    counts = parameter_counts(cfg)
    assert counts.total == pytest.approx(cfg.published_total_params, rel=PARAM_TOLERANCE)
    if cfg.published_active_params is not None:
        assert counts.active == pytest.approx(cfg.published_active_params, rel=PARAM_TOLERANCE)
    else:
        assert counts.active == counts.total  # dense: every weight is read for every token


def test_llama_8b_param_count_hand_worked():
    # embedding 128256*4096 = 525,336,576; untied lm_head doubles it: 1,050,673,152
    # per layer: q 4096*4096 = 16,777,216; k, v 4096*1024 = 4,194,304 each; o 16,777,216 -> 41,943,040
    #            MLP 3*4096*14336 = 176,160,768; 2 RMSNorms 2*4096 = 8,192 -> 218,112,000
    # 32 layers: 6,979,584,000; final norm 4,096
    # total 1,050,673,152 + 6,979,584,000 + 4,096 = 8,030,261,248 (Hugging Face reports 8,030,261,248)
    counts = parameter_counts(get_model("llama-3.1-8b"))
    assert counts.total == 8_030_261_248
    assert counts.lm_head == counts.embedding == 525_336_576


def test_mixtral_active_params_hand_worked():
    # one expert: 3*4096*14336 = 176,160,768; top-2 of 8 in 32 layers: 2*32*176,160,768 = 11,274,289,152 active
    # routed total 8*32*176,160,768 = 45,097,156,608; attention 32*41,943,040 = 1,342,177,280;
    # embeddings 2*32000*4096 = 262,144,000; routers 32*4096*8 = 1,048,576; norms (64+1)*4096 = 266,240
    counts = parameter_counts(get_model("mixtral-8x7b"))
    assert counts.routed_experts == 45_097_156_608
    assert counts.total == 45_097_156_608 + 1_342_177_280 + 262_144_000 + 1_048_576 + 266_240
    assert counts.active == counts.total - 45_097_156_608 + 11_274_289_152


def test_deepseek_mla_attention_params_hand_worked():
    # q_a 7168*1536 + q_a_norm 1536 + q_b 1536*128*192 = 11,010,048 + 1,536 + 37,748,736
    # kv_a 7168*(512+64) + kv_a_norm 512 = 4,128,768 + 512; kv_b 512*128*(128+128) = 16,777,216
    # o 128*128*7168 = 117,440,512  -> 187,107,328 per layer
    assert schema.attention_params_per_layer(get_model("deepseek-v3")) == 187_107_328


def test_gemma_layout():
    cfg = get_model("gemma-3-27b")
    # 62 layers, every 6th global: 10 global, 52 sliding
    assert (cfg.num_global_layers, cfg.num_sliding_window_layers) == (10, 52)
    assert cfg.tie_embeddings and parameter_counts(cfg).lm_head == 0


@pytest.mark.parametrize("typed", ["Llama-3.1-8B", "llama3.1-8b", "LLAMA 3.1 8b", "llama_3.1_8b"])
def test_lookup_by_alias_and_spelling(typed):
    assert get_model(typed).name == "llama-3.1-8b"


def test_unknown_model_suggests_close_names():
    with pytest.raises(InputError, match=r"unknown model 'llama-3.1-7b'; did you mean .*llama-3.1-8b.*known models:"):
        get_model("llama-3.1-7b")


def test_missing_path_is_one_line_error(tmp_path):
    with pytest.raises(InputError, match=r"model config '.*nope\.json' does not exist"):
        get_model(str(tmp_path / "nope.json"))


# --------------------------------------------------------------------------- Hugging Face config.json

LLAMA_8B_HF = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu", "hidden_size": 4096,
    "intermediate_size": 14336, "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
    "head_dim": 128, "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": False,
    "vocab_size": 128256, "torch_dtype": "bfloat16",
}


def _write(tmp_path: Path, data: dict, name: str = "config.json", folder: str = "my-model") -> Path:
    d = tmp_path / folder
    d.mkdir(exist_ok=True)
    f = d / name
    f.write_text(json.dumps(data))
    return f


def test_hf_llama_matches_preset(tmp_path):
    cfg = load_hf_config(_write(tmp_path, LLAMA_8B_HF))
    assert cfg.name == "my-model"
    assert parameter_counts(cfg).total == parameter_counts(get_model("llama-3.1-8b")).total
    assert (cfg.num_kv_heads, cfg.head_dim, cfg.moe, cfg.mla, cfg.sliding_window_tokens) == (8, 128, None, None, None)


def test_hf_config_by_directory_and_path(tmp_path):
    f = _write(tmp_path, LLAMA_8B_HF)
    assert get_model(str(f.parent)).hidden_size == 4096
    assert get_model(str(f)).num_layers == 32


def test_hf_defaults_head_dim_and_kv_heads(tmp_path):
    data = {k: v for k, v in LLAMA_8B_HF.items() if k not in ("head_dim", "num_key_value_heads")}
    cfg = load_hf_config(_write(tmp_path, data))
    # HF defaults: head_dim = hidden / heads = 4096 / 32; MHA when num_key_value_heads is absent
    assert (cfg.head_dim, cfg.num_kv_heads) == (128, 32)


def test_hf_mixtral(tmp_path):
    data = {**LLAMA_8B_HF, "model_type": "mixtral", "num_local_experts": 8, "num_experts_per_tok": 2,
            "vocab_size": 32000, "sliding_window": None}
    cfg = load_hf_config(_write(tmp_path, data))
    assert cfg.moe == schema.MoEConfig(num_experts=8, experts_per_token=2, expert_intermediate_size=14336,
                                        shared_expert_intermediate_size=None, num_moe_layers=32)
    assert cfg.num_dense_layers == 0
    assert parameter_counts(cfg).total == parameter_counts(get_model("mixtral-8x7b")).total


def test_hf_qwen_moe_with_dense_only_layers(tmp_path):
    # 12 layers, decoder_sparse_step 2 -> layers 1,3,5,7,9,11 (0-based) are MoE; mlp_only_layers removes 3 -> 5
    data = {**LLAMA_8B_HF, "model_type": "qwen2_moe", "num_hidden_layers": 12, "num_experts": 60,
            "num_experts_per_tok": 4, "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632,
            "decoder_sparse_step": 2, "mlp_only_layers": [3], "use_sliding_window": False, "sliding_window": 4096}
    cfg = load_hf_config(_write(tmp_path, data))
    assert cfg.moe.num_moe_layers == 5 and cfg.num_dense_layers == 7
    assert cfg.moe.shared_expert_intermediate_size == 5632
    assert cfg.sliding_window_tokens is None  # use_sliding_window false


DEEPSEEK_V3_HF = {
    "model_type": "deepseek_v3", "hidden_size": 7168, "num_hidden_layers": 61, "num_attention_heads": 128,
    "num_key_value_heads": 128, "intermediate_size": 18432, "moe_intermediate_size": 2048, "n_routed_experts": 256,
    "n_shared_experts": 1, "num_experts_per_tok": 8, "first_k_dense_replace": 3, "moe_layer_freq": 1,
    "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
    "vocab_size": 129280, "tie_word_embeddings": False, "hidden_act": "silu", "rope_theta": 10000,
}


def test_hf_deepseek_matches_preset(tmp_path):
    cfg = load_hf_config(_write(tmp_path, DEEPSEEK_V3_HF))
    preset = get_model("deepseek-v3")
    assert cfg.mla == preset.mla and cfg.moe == preset.moe and cfg.head_dim == 192
    assert parameter_counts(cfg).total == parameter_counts(preset).total


GEMMA3_HF = {
    "architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
    "text_config": {"head_dim": 128, "hidden_size": 5376, "intermediate_size": 21504, "model_type": "gemma3_text",
                    "num_attention_heads": 32, "num_hidden_layers": 62, "num_key_value_heads": 16,
                    "sliding_window": 1024, "sliding_window_pattern": 6, "vocab_size": 262208,
                    "hidden_activation": "gelu_pytorch_tanh"},
    "vision_config": {"hidden_size": 1152},
}


def test_hf_gemma3_text_config(tmp_path):
    cfg = load_hf_config(_write(tmp_path, GEMMA3_HF))
    preset = get_model("gemma-3-27b")
    assert (cfg.sliding_window_tokens, cfg.num_sliding_window_layers) == (1024, 52)
    assert (cfg.norms_per_layer, cfg.qk_norm, cfg.mlp_activation, cfg.tie_embeddings) == (4, True, "gelu_tanh", True)
    assert parameter_counts(cfg).total == parameter_counts(preset).total


def test_hf_layer_types_list(tmp_path):
    tc = {**GEMMA3_HF["text_config"], "num_hidden_layers": 4,
          "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "sliding_attention"]}
    cfg = load_hf_config(_write(tmp_path, {**GEMMA3_HF, "text_config": tc}))
    assert cfg.num_sliding_window_layers == 3


@pytest.mark.parametrize("field", ["hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size",
                                   "intermediate_size"])
def test_hf_missing_field_names_field_and_file(tmp_path, field):
    data = {k: v for k, v in LLAMA_8B_HF.items() if k != field}
    f = _write(tmp_path, data)
    with pytest.raises(InputError, match=rf"^{f}: field '{field}' is missing"):
        load_hf_config(f)


def test_hf_missing_field_inside_text_config(tmp_path):
    tc = {k: v for k, v in GEMMA3_HF["text_config"].items() if k != "vocab_size"}
    f = _write(tmp_path, {**GEMMA3_HF, "text_config": tc})
    with pytest.raises(InputError, match=r"field 'text_config.vocab_size' is missing"):
        load_hf_config(f)


def test_hf_missing_moe_field(tmp_path):
    data = {k: v for k, v in DEEPSEEK_V3_HF.items() if k != "num_experts_per_tok"}
    with pytest.raises(InputError, match=r"field 'num_experts_per_tok' is missing"):
        load_hf_config(_write(tmp_path, data))


def test_hf_missing_mla_field(tmp_path):
    data = {k: v for k, v in DEEPSEEK_V3_HF.items() if k != "v_head_dim"}
    with pytest.raises(InputError, match=r"field 'v_head_dim' is missing"):
        load_hf_config(_write(tmp_path, data))


@pytest.mark.parametrize(("field", "value", "message"), [
    ("hidden_size", -4096, r"field 'hidden_size' must be positive, got -4096"),
    ("hidden_size", 0, r"field 'hidden_size' must be positive, got 0"),
    ("num_hidden_layers", 31.5, r"field 'num_hidden_layers' must be a whole number, got 31.5"),
    ("vocab_size", "big", r"field 'vocab_size' must be a whole number, got 'big'"),
    # the message names the file's own field, not the internal one
    ("num_key_value_heads", 5, r"field 'num_key_value_heads' \(5\) must divide 'num_attention_heads' \(32\)"),
    ("num_key_value_heads", 0, r"field 'num_key_value_heads' must be positive, got 0"),
    ("hidden_act", "tanh", r"field 'hidden_act' is 'tanh'; the model knows"),
    # llama's MLP is gated: a relu one would be ReGLU, which is not modelled (never silently SwiGLU)
    ("hidden_act", "relu", r"field 'mlp_activation' 'relu' with 'mlp_gated' true \(a ReGLU-style MLP\) is not"),
    ("model_type", "mystery", r"field 'model_type' is 'mystery', whose MLP layout perfmodel does not know; add "
                              r"\"mlp_gated\": true"),
    ("attention_bias", True, r"field 'attention_bias' is true: attention projection biases are not modelled"),
    ("tie_word_embeddings", "no", r"field 'tie_word_embeddings' must be true or false"),
    ("rope_theta", "high", r"field 'rope_theta' must be a number"),
])
def test_hf_bad_values(tmp_path, field, value, message):
    with pytest.raises(InputError, match=message):
        load_hf_config(_write(tmp_path, {**LLAMA_8B_HF, field: value}))


def test_hf_head_dim_needed_when_hidden_does_not_split(tmp_path):
    # 4000 / 32 = 125 exactly, 4001 / 32 is not whole: then the file must state head_dim
    data = {k: v for k, v in LLAMA_8B_HF.items() if k != "head_dim"}
    assert load_hf_config(_write(tmp_path, {**data, "hidden_size": 4000})).head_dim == 125
    with pytest.raises(InputError, match=r"field 'hidden_size' \(4001\) is not a multiple of 'num_attention_heads' "
                                         r"\(32\); add 'head_dim'"):
        load_hf_config(_write(tmp_path, {**data, "hidden_size": 4001}))


def test_hf_malformed_json(tmp_path):
    f = tmp_path / "config.json"
    f.write_text('{"hidden_size": 4096,\n "num_hidden_layers": }')
    with pytest.raises(InputError, match=r"config.json:2: malformed JSON"):
        load_hf_config(f)


def test_hf_not_an_object(tmp_path):
    f = tmp_path / "config.json"
    f.write_text("[1, 2]")
    with pytest.raises(InputError, match=r"expected a JSON object"):
        load_hf_config(f)


# --------------------------------------------------------------------------- strict YAML presets


def _preset_text(name: str) -> str:
    return (configs.presets_dir() / f"{name}.yaml").read_text()


def _load_text(tmp_path: Path, text: str):
    f = tmp_path / "m.yaml"
    f.write_text(text)
    return get_model(str(f))


def test_yaml_copy_of_preset_loads(tmp_path):
    assert _load_text(tmp_path, _preset_text("deepseek-v3")) == get_model("deepseek-v3")


def test_yaml_missing_key(tmp_path):
    text = _preset_text("llama-3.1-8b").replace("vocab_size: 128256\n", "")
    with pytest.raises(SpecError, match=r"m.yaml:\d+:.*missing key\(s\) vocab_size"):
        _load_text(tmp_path, text)


def test_yaml_unknown_key_suggests(tmp_path):
    text = _preset_text("llama-3.1-8b").replace("vocab_size:", "vocab_sise:")
    with pytest.raises(SpecError, match=r"field 'vocab_sise' unknown key in ModelConfig; did you mean 'vocab_size'"):
        _load_text(tmp_path, text)


def test_yaml_number_without_source(tmp_path):
    text = _preset_text("llama-3.1-8b").replace("  vocab_size: hf-config\n", "")
    with pytest.raises(SpecError, match=r"field 'vocab_size' has no entry in 'sources'"):
        _load_text(tmp_path, text)


def test_yaml_source_names_unknown_reference(tmp_path):
    text = _preset_text("llama-3.1-8b").replace("  vocab_size: hf-config\n", "  vocab_size: nowhere\n")
    with pytest.raises(SpecError, match=r"names reference 'nowhere'"):
        _load_text(tmp_path, text)


def test_yaml_unit_suffix_rejected(tmp_path):
    text = _preset_text("llama-3.1-8b").replace("hidden_size: 4096", "hidden_size: 4096 elements")
    with pytest.raises(SpecError, match=r"field 'hidden_size'"):
        _load_text(tmp_path, text)


@pytest.mark.parametrize(("change", "message"), [
    ({"moe": schema.MoEConfig(num_experts=2, experts_per_token=4, expert_intermediate_size=8,
                               shared_expert_intermediate_size=None, num_moe_layers=1)},
     r"'moe.experts_per_token' \(4\) exceeds 'moe.num_experts' \(2\)"),
    ({"moe": schema.MoEConfig(num_experts=8, experts_per_token=2, expert_intermediate_size=8,
                               shared_expert_intermediate_size=None, num_moe_layers=99)},
     r"'moe.num_moe_layers' \(99\) exceeds 'num_layers' \(32\)"),
    ({"sliding_window_tokens": 1024}, r"'sliding_window_tokens' and 'num_sliding_window_layers' must be both"),
    ({"sliding_window_tokens": 1024, "num_sliding_window_layers": 40}, r"'num_sliding_window_layers' \(40\) exceeds"),
    ({"intermediate_size": None}, r"'intermediate_size' is null but 32 layer\(s\) have a dense MLP"),
    ({"mlp_activation": "swish"}, r"'mlp_activation' must be one of silu, gelu_tanh, gelu, relu"),
    ({"mlp_activation": "relu"}, r"'mlp_activation' 'relu' with 'mlp_gated' true \(a ReGLU-style MLP\)"),
    ({"norm": "layernorm"}, r"'norm' must be one of rmsnorm"),
    ({"norms_per_layer": 3}, r"'norms_per_layer' must be 2 or 4"),
    ({"mla": schema.MLAConfig(kv_lora_rank=512, q_lora_rank=None, qk_nope_head_dim=64, qk_rope_head_dim=32,
                               v_head_dim=64)}, r"'head_dim' \(128\) must equal"),
])
def test_validate_cross_field_errors(change, message):
    cfg = dataclasses.replace(get_model("llama-3.1-8b"), **change)
    with pytest.raises(InputError, match=message):
        schema.validate(cfg, "x", require_sources=False)


def test_moe_needs_gated_experts_without_bias():
    moe = get_model("mixtral-8x7b")
    with pytest.raises(InputError, match=r"field 'mlp_gated' is false but the model has MoE layers"):
        schema.validate(dataclasses.replace(moe, mlp_gated=False), "x", require_sources=False)
    with pytest.raises(InputError, match=r"field 'mlp_bias' is true but the model has MoE layers"):
        schema.validate(dataclasses.replace(moe, mlp_bias=True), "x", require_sources=False)


# --------------------------------------------------------------------------- non-gated MLPs (issue 10 part 5)

#: A GPT-NeoX-like layout with RMSNorm (so that the model can honour it): non-gated GELU MLP with biases.
NON_GATED_HF = {**LLAMA_8B_HF, "model_type": "gpt_neox", "hidden_act": "gelu", "mlp_bias": True,
                "hidden_size": 1024, "intermediate_size": 4096, "num_attention_heads": 16, "num_key_value_heads": 16,
                "head_dim": 64, "num_hidden_layers": 2, "vocab_size": 1000}


def test_hf_non_gated_gelu_with_bias(tmp_path):
    cfg = load_hf_config(_write(tmp_path, NON_GATED_HF))
    assert (cfg.mlp_gated, cfg.mlp_activation, cfg.mlp_bias) == (False, "gelu", True)
    # per layer: up 1024x4096 + down 4096x1024 + biases 4096 + 1024 = 8,393,728 (a GeGLU would add 4,194,304 more)
    assert parameter_counts(cfg).dense_mlp == 2 * (2 * 1024 * 4096 + 4096 + 1024)
    assert "dense MLP 4096 (gelu +bias)" in configs.describe(cfg)


@pytest.mark.parametrize("extra,gated", [({"model_type": "opt"}, False), ({"model_type": "qwen3"}, True),
                                         ({"model_type": "mystery", "mlp_gated": False}, False)])
def test_hf_gating_from_family_or_explicit_field(tmp_path, extra, gated):
    cfg = load_hf_config(_write(tmp_path, {**NON_GATED_HF, **extra}))
    assert cfg.mlp_gated is gated


@pytest.mark.parametrize("field,value,message", [
    ("layer_norm_eps", 1e-5, r"field 'layer_norm_eps': LayerNorm is not modelled \(only RMSNorm\)"),
    ("parallel_attn", True, r"field 'parallel_attn' is true: parallel attention \+ MLP blocks are not modelled"),
])
def test_hf_unmodelled_layouts_are_errors(tmp_path, field, value, message):
    data = {k: v for k, v in NON_GATED_HF.items() if k != "rms_norm_eps"} | {field: value}
    with pytest.raises(InputError, match=message):
        load_hf_config(_write(tmp_path, data))


def test_describe_mentions_the_architecture():
    text = configs.describe(get_model("deepseek-v3"))
    assert "MLA latent 512+64" in text and "MoE 8/256" in text and "dense MLP 18432" in text


def test_no_jax_import():
    code = ("import sys, perfmodel.model.configs as c; c.all_presets(); "
            "assert 'jax' not in sys.modules, 'jax imported'")
    subprocess.run([sys.executable, "-c", code], check=True)
