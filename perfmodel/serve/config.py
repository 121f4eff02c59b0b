"""The server being simulated: vLLM's engine flags (``vllm serve``) as one frozen :class:`EngineConfig`.

:func:`engine_config` checks every flag and fills vLLM's defaults where a flag is not given:

* ``max_num_seqs`` 256 and ``max_num_batched_tokens`` 2048 on a chip with under 70 GiB of HBM, 1024 and 8192 at
  or above (vllm/engine/arg_utils.py, the OpenAI server's defaults; vLLM also lists lower TPU token budgets keyed
  by device name, which tpu-inference's device names do not match, so the generic rule is the one that applies);
* ``block_size``: tpu-inference's page size (``PallasAttentionBackend.get_page_size``,
  vllm-project/tpu-inference@b8692ff0): 16 above an 8192-token ``max_model_len``, else
  ``next_power_of_2(max_model_len) // 16`` clamped to [16, 256];
* ``max_model_len``: the longest request of the workload (prompt + output) when not given (perfmodel's presets do
  not carry the model's maximum position count);
* prefix caching and chunked prefill on (vLLM v1's defaults), ``gpu_memory_utilization`` 0.9.

``engine="jetstream"`` simulates JetStream's orchestrator instead (``max_num_seqs`` decode slots, one whole
prompt per prefill, perfmodel.serve.jetstream).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from perfmodel.errors import InputError

ENGINES: tuple[str, ...] = ("vllm", "jetstream")
SPEC_METHODS: tuple[str, ...] = ("ngram", "eagle", "eagle3", "mtp", "draft_model")
#: vLLM's quantization names -> perfmodel weight dtypes (--quantization).
QUANTIZATIONS: dict[str, str] = {"fp8": "fp8", "int8": "int8", "tpu_int8": "int8", "int4": "int4", "awq": "int4",
                                 "gptq": "int4", "none": "bf16"}
#: HBM per chip at or above which vLLM raises its default limits (vllm/engine/arg_utils.py: 70 GiB).
LARGE_DEVICE_HBM_BYTES = 70 * 2**30


@dataclass(frozen=True, kw_only=True)
class SpeculativeConfig:
    """``--speculative-config``: the proposer and how often its drafts are accepted."""

    method: str
    num_speculative_tokens: int
    #: draft_model: the draft's perfmodel preset or config path.
    draft_model: str | None = None
    #: Probability that the draft at position j (1..k) is accepted, as vLLM's per-position acceptance rate
    #: counts it (accepted at j needs every position before j accepted, so the list does not increase).
    acceptance: tuple[float, ...] = ()

    @property
    def mean_accepted(self) -> float:
        """Expected accepted drafts per verification step (the sum of the per-position rates)."""
        return float(sum(self.acceptance))


def parse_speculative_config(text: str | None, acceptance_rate: str | None) -> SpeculativeConfig | None:
    """``--speculative-config JSON`` and ``--acceptance-rate`` (one rate per token, or a comma list, one per
    position) into a :class:`SpeculativeConfig`; None without a config."""
    if text is None:
        if acceptance_rate is not None:
            raise InputError("`acceptance_rate` applies to speculative decoding; give --speculative-config too")
        return None
    try:
        cfg = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"`speculative_config`: not JSON ({exc.msg}); e.g. "
                         "'{\"method\": \"eagle3\", \"num_speculative_tokens\": 3}'") from None
    if not isinstance(cfg, dict):
        raise InputError("`speculative_config`: give a JSON object, e.g. '{\"method\": \"ngram\", "
                         "\"num_speculative_tokens\": 4}'")
    model = cfg.get("model")
    method = cfg.get("method") or ("ngram" if model in ("ngram", "[ngram]") else "draft_model" if model else None)
    if method not in SPEC_METHODS:
        raise InputError(f"`speculative_config`: method '{method}' is not modelled; use one of "
                         f"{', '.join(SPEC_METHODS)}")
    k = cfg.get("num_speculative_tokens")
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise InputError(f"`speculative_config`: num_speculative_tokens must be a whole number >= 1, got {k!r}")
    known = {"method", "model", "num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min",
             "draft_tensor_parallel_size"}
    unknown = sorted(set(cfg) - known)
    if unknown:
        raise InputError(f"`speculative_config`: unknown key '{unknown[0]}'; keys: {', '.join(sorted(known))}")
    draft = None
    if method == "draft_model":
        if not isinstance(model, str) or model in ("ngram", "[ngram]"):
            raise InputError("`speculative_config`: method draft_model needs \"model\": a preset name or a "
                             "config.json path of the draft")
        draft = model
    if acceptance_rate is None:
        raise InputError("`acceptance_rate`: speculative decoding needs an acceptance model: one rate per drafted "
                         "token (e.g. 0.7) or one per position (e.g. 0.8,0.6,0.4)")
    rates = _acceptance(acceptance_rate, k)
    return SpeculativeConfig(method=method, num_speculative_tokens=k, draft_model=draft, acceptance=rates)


def _acceptance(text: str, k: int) -> tuple[float, ...]:
    try:
        values = [float(x) for x in str(text).split(",")]
    except ValueError:
        raise InputError(f"`acceptance_rate`: got '{text}'; give a number in [0, 1] or a comma list, one per "
                         "position") from None
    if any(not 0.0 <= v <= 1.0 for v in values):
        raise InputError(f"`acceptance_rate`: every rate must be in [0, 1], got '{text}'")
    if len(values) == 1:  # one conditional rate per token: position j is accepted with rate^j
        return tuple(values[0] ** j for j in range(1, k + 1))
    if len(values) != k:
        raise InputError(f"`acceptance_rate`: {len(values)} rates for num_speculative_tokens {k}; give one per "
                         "position or a single rate")
    if any(b > a + 1e-12 for a, b in zip(values, values[1:])):
        raise InputError("`acceptance_rate`: per-position rates cannot increase (a draft is accepted only when "
                         "every earlier one was); give them as vLLM reports them")
    return tuple(values)


@dataclass(frozen=True, kw_only=True)
class EngineConfig:
    """One server replica's settings (``dp`` replicas share the stream)."""

    engine: str = "vllm"
    model: Any  # perfmodel.model.schema.ModelConfig
    chip: Any  # perfmodel.hw.spec.ChipSpec
    tp: int = 1
    dp: int = 1
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    gpu_memory_utilization: float = 0.9
    block_size: int
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    weight_dtype: str = "bf16"
    act_dtype: str = "bf16"
    kv_cache_dtype: str = "bf16"
    speculative: SpeculativeConfig | None = None
    #: Pad each step to tpu-inference's precompiled shapes (perfmodel.serve.padding).
    padding: bool = True
    #: Host time per engine step (scheduling, input preparation, the sampler's sync), seconds: this much per
    #: step plus ``host_overhead_per_seq_s`` per request in the step.
    host_overhead_s: float
    host_overhead_per_seq_s: float = 0.0
    #: Where host_overhead_s comes from.
    host_overhead_source: str = ""
    #: (op name, speedup) pairs: that op of every step runs this many times faster (--op-speedup).
    op_speedups: tuple[tuple[str, float], ...] = ()
    #: Decode slots' prompt bucket cap for JetStream (its max_prefill_length).
    jetstream_max_prefill_length: int = 8192
    #: With --compile: perfmodel.serve.compiled.CompiledScales (compiled / analytic step ratios); None: analytic.
    compiled: Any = None

    def device_factor(self, decode_tokens: int, prefill_tokens: int) -> float:
        """Factor on a step's device time (1 without --compile)."""
        if self.compiled is None:
            return 1.0
        from perfmodel.serve.compiled import scale_factor

        return scale_factor(self.compiled, decode_tokens, prefill_tokens)

    def host_s(self, seqs: int | float) -> float:
        """Host seconds of a step of ``seqs`` requests."""
        return self.host_overhead_s + self.host_overhead_per_seq_s * seqs


def default_limits(chip: Any) -> tuple[int, int]:
    """vLLM's (max_num_seqs, max_num_batched_tokens) defaults for the OpenAI server on this chip's HBM."""
    large = chip.memory.hbm_bytes_per_chip >= LARGE_DEVICE_HBM_BYTES
    return (1024, 8192) if large else (256, 2048)


def default_block_size(max_model_len: int) -> int:
    """tpu-inference's default page size for ``max_model_len`` (see the module docstring)."""
    from perfmodel.serve.padding import next_power_of_2

    if max_model_len > 8192:
        return 16
    return min(max(next_power_of_2(max_model_len) // 16, 16), 256)


#: Largest value a server flag may take (far beyond any real server; keeps arrays and tables finite).
MAX_FLAG = 100_000_000


def _whole(name: str, value: Any, minimum: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InputError(f"`{name}` must be a whole number >= {minimum}, got {value}")
    if value > MAX_FLAG:
        raise InputError(f"`{name}` {value} is beyond any server; at most {MAX_FLAG:,}")


def engine_config(*, model: Any, chip: Any, engine: str = "vllm", tp: int = 1, dp: int = 1,
                  max_num_seqs: int | None = None, max_num_batched_tokens: int | None = None,
                  max_model_len: int | None = None, longest_request: int | None = None,
                  gpu_memory_utilization: float = 0.9, block_size: int | None = None,
                  enable_prefix_caching: bool = True, enable_chunked_prefill: bool = True,
                  weight_dtype: str = "bf16", act_dtype: str = "bf16", kv_cache_dtype: str | None = None,
                  quantization: str | None = None, speculative: SpeculativeConfig | None = None,
                  padding: bool = True, host_overhead_s: float | None = None,
                  host_overhead_per_seq_s: float | None = None,
                  op_speedups: tuple[tuple[str, float], ...] = ()) -> EngineConfig:
    """A checked :class:`EngineConfig` with vLLM's defaults filled in (module docstring); one-line InputError
    naming the flag for anything wrong."""
    from perfmodel.model.dtypes import parse_dtype
    from perfmodel.serve import calibration

    if engine not in ENGINES:
        raise InputError(f"`engine`: got '{engine}'; use one of {', '.join(ENGINES)}")
    for name, value in (("tp", tp), ("dp", dp)):
        _whole(name, value)
    seqs_default, tokens_default = default_limits(chip)
    max_num_seqs = seqs_default if max_num_seqs is None else max_num_seqs
    max_num_batched_tokens = tokens_default if max_num_batched_tokens is None else max_num_batched_tokens
    _whole("max_num_seqs", max_num_seqs)
    _whole("max_num_batched_tokens", max_num_batched_tokens)
    if max_model_len is None:
        if longest_request is None:
            raise InputError("`max_model_len`: give the longest sequence the server accepts")
        max_model_len = int(longest_request)
    _whole("max_model_len", max_model_len, minimum=2)
    if not 0.0 < gpu_memory_utilization <= 1.0:
        raise InputError(f"`gpu_memory_utilization` must be in (0, 1], got {gpu_memory_utilization}")
    block_size = default_block_size(max_model_len) if block_size is None else block_size
    _whole("block_size", block_size)
    if engine == "vllm" and max_num_batched_tokens < max_num_seqs:
        raise InputError(f"`max_num_batched_tokens` ({max_num_batched_tokens}) must be >= `max_num_seqs` "
                         f"({max_num_seqs}), as vLLM requires; raise it or lower --max-num-seqs")
    if engine == "vllm" and not enable_chunked_prefill and max_num_batched_tokens < max_model_len:
        raise InputError(f"`max_num_batched_tokens` ({max_num_batched_tokens}) is smaller than `max_model_len` "
                         f"({max_model_len}) with chunked prefill off: vLLM would reject longer prompts; raise "
                         "--max-num-batched-tokens, lower --max-model-len or --enable-chunked-prefill")
    if quantization is not None:
        if quantization not in QUANTIZATIONS:
            raise InputError(f"`quantization`: got '{quantization}'; use one of {', '.join(QUANTIZATIONS)}")
        if weight_dtype not in ("bf16", QUANTIZATIONS[quantization]):
            raise InputError(f"`quantization` {quantization} means {QUANTIZATIONS[quantization]} weights but "
                             f"`weight_dtype` is {weight_dtype}; give one of them")
        weight_dtype = QUANTIZATIONS[quantization]
    weights = parse_dtype(weight_dtype, "`weight_dtype`")
    acts = parse_dtype(act_dtype, "`act_dtype`")
    kv = parse_dtype("bf16" if kv_cache_dtype in (None, "auto") else kv_cache_dtype, "`kv_cache_dtype`")
    if speculative is not None and engine == "jetstream":
        raise InputError("`speculative_config`: the JetStream engine here has no speculative decoding; use "
                         "--engine vllm")
    for name, factor in op_speedups:
        if not (factor > 0 and math.isfinite(factor)):
            raise InputError(f"`op_speedup` {name}={factor}: the speedup must be a finite number > 0")
    fitted_step, fitted_seq, source = calibration.host_overhead(engine)
    for name, value in (("host_overhead_ms", host_overhead_s), ("host_overhead_per_request_ms",
                                                                 host_overhead_per_seq_s)):
        if value is not None and not (0 <= value <= 10.0):
            raise InputError(f"`{name}` must be between 0 and 10,000 ms, got {value * 1e3}")
    if host_overhead_s is not None or host_overhead_per_seq_s is not None:
        source = "given (--host-overhead-ms / --host-overhead-per-request-ms)"
    host_overhead_s = fitted_step if host_overhead_s is None else host_overhead_s
    host_overhead_per_seq_s = fitted_seq if host_overhead_per_seq_s is None else host_overhead_per_seq_s
    return EngineConfig(engine=engine, model=model, chip=chip, tp=tp, dp=dp, max_num_seqs=max_num_seqs,
                        max_num_batched_tokens=max_num_batched_tokens, max_model_len=max_model_len,
                        gpu_memory_utilization=gpu_memory_utilization, block_size=block_size,
                        enable_prefix_caching=enable_prefix_caching, enable_chunked_prefill=enable_chunked_prefill,
                        weight_dtype=weights, act_dtype=acts, kv_cache_dtype=kv, speculative=speculative,
                        padding=padding, host_overhead_s=float(host_overhead_s),
                        host_overhead_per_seq_s=float(host_overhead_per_seq_s), host_overhead_source=source,
                        op_speedups=tuple(op_speedups), jetstream_max_prefill_length=max(max_model_len, 16))
