"""``perfmodel serve --compile``: the step model checked against the TPU compiler at two representative shapes.

perfmodel.xla.compare compiles a reference JAX step of the model with libtpu (deviceless, cached) and times its
schedule; here that is done for a decode step (the stream's typical running batch over its mean context) and a
prefill chunk (``max_num_batched_tokens`` new tokens), and each ratio compiled / analytic scales the device part
of the simulated steps: a decode-only step by the decode ratio, a step with prefill tokens by the token-weighted
blend of the two. The compiled reference steps are plain JAX (jnp attention over a paged cache), not the server's
kernels, so the ratios say how far XLA's code for this model is from the analytic expectation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from perfmodel.serve.config import EngineConfig
from perfmodel.serve.padding import next_power_of_2


@dataclass(frozen=True, kw_only=True)
class CompiledScales:
    decode: float
    prefill: float
    #: What was compiled: (phase, batch, context or chunk, analytic s, compiled s) per shape.
    shapes: tuple[tuple[str, int, int, float, float], ...]


def compiled_scales(model_ref: str, cfg: EngineConfig, *, decode_batch: int, decode_context: int,
                    progress: Callable[[str], None] | None = None) -> CompiledScales:
    """Compile the decode and prefill reference steps of ``model_ref`` (a preset name or config path) and return
    their compiled / analytic ratios."""
    from perfmodel.xla.compare import compare_step

    common = dict(chip=cfg.chip, weight_dtype=cfg.weight_dtype, act_dtype=cfg.act_dtype, kv_dtype=cfg.kv_cache_dtype,
                  tp=cfg.tp, progress=progress)
    batch = min(max(next_power_of_2(decode_batch), 8), max(cfg.max_num_seqs, 8))
    dec = compare_step(model_ref, phase="decode", batch=batch, context=decode_context, **common)
    chunk = min(cfg.max_num_batched_tokens, cfg.max_model_len)
    pre = compare_step(model_ref, phase="prefill", batch=1, prefill_len=chunk, context=0, **common)
    return CompiledScales(decode=dec.compiled_s / dec.analytic_s, prefill=pre.compiled_s / pre.analytic_s,
                          shapes=(("decode", batch, decode_context, dec.analytic_s, dec.compiled_s),
                                  ("prefill", 1, chunk, pre.analytic_s, pre.compiled_s)))


def scale_factor(scales: Any, decode_tokens: int, prefill_tokens: int) -> float:
    """The factor on a step's device time: the token-weighted blend of the decode and prefill ratios."""
    if scales is None:
        return 1.0
    total = decode_tokens + prefill_tokens
    if total <= 0:
        return scales.decode
    return (scales.decode * decode_tokens + scales.prefill * prefill_tokens) / total
