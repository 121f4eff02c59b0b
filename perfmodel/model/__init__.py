"""The analytic roofline model of LLM-inference ops (numpy only; no jax at import).

core          OpCost (work by unit, bytes by level), evaluate() -> Roofline, combine(), to_cost_estimate()
dtypes        dtype names / sizes / aliases, parse_dtype(), per-generation MXU dtype rules (matmul_path)
shapes        size validation, tile padding (Tiles, chip_tiles)
gemm          gemm(): batched GEMM, quantized weights / activations, scales, fused epilogues
attention     flash_attention(), paged_decode_attention(), ragged_paged_attention(), mla_decode()
sampling      sampling(): penalties, temperature, top-k / top-p (sort vs threshold), min-p, the draw
kvcache       kv_cache_update(), kv_gather(), kv_bytes_per_token(), kv_capacity()
fused         rms_norm(), glu() / swiglu() / geglu(), rope(), dequant_gemm(): fused vs unfused traffic
collectives   all_gather(), reduce_scatter(), all_reduce() over ICI
elementwise   per-element VPU / EUP costs of epilogues and activations
distributions per-sequence length lists ("1x64,512x2") and quantile distributions
schema        ModelConfig (MoE, MLA layouts), parameter_counts(), validate()
configs       presets, get_model() (preset name or alias, model YAML file, config.json path), describe()
hf_config     load_hf_config(): a ModelConfig from a local Hugging Face config.json
step          Step: one step's inputs, make_step() / mixed_step() (validated, flag-named errors)
sharding      one chip's share under TP: Shard, weight_matrices(), weight / KV bytes, memory_fit()
transformer   whole-model steps: step_ops(), predict_step() (built on the functions above)

Every op function takes keyword arguments, numbers or numpy arrays for sizes
(vectorized), and ``chip=None`` for hardware-independent counts (pl.CostEstimate).
"""
