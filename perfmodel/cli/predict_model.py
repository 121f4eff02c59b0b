"""``perfmodel predict model``: one prefill chunk or decode step of a whole transformer.

Parses the options, calls :func:`perfmodel.predict.steps.step_sweep` and
prints its result with :mod:`perfmodel.predict.step_render`; ``--hw`` /
``--sweep`` / ``--json`` / ``--csv`` come from
:mod:`perfmodel.cli.predict_common`. No numpy, jax or model import until
the command runs.
"""

from __future__ import annotations

import click

from perfmodel.cli.common import emit, output_format, user_errors
from perfmodel.cli.common import Progress
from perfmodel.cli.predict_common import SWEEP_BAR_POINTS, predict_options, sweep_points
from perfmodel.errors import InputError

_HELP = """Predict one step of a transformer: per-op roofline table, step floor, tokens/s, MBU/MFU, HBM fit.

NAME is a built-in model (--list shows them) or use --config PATH for a Hugging Face
config.json (read locally, no network). A decode step generates one token for each of
--batch sequences attending to --context tokens; a prefill step pushes --prefill-len new
tokens per sequence after --context cached ones. --tp splits the model over that many
chips (Megatron-style, all-reduces over ICI); times are per step, throughput counts all chips.

\b
Examples:
  perfmodel predict model llama-3.1-8b --hw v5e --batch 1 --context 1024
  perfmodel predict model llama-3.1-70b --hw v6e --tp 8 --batch 64 --context 4096 --kv-dtype int8
  perfmodel predict model deepseek-v3 --hw v5p --tp 16 --weight-dtype fp8 --sweep batch=1,16,128
  perfmodel predict model qwen3-32b --phase prefill --prefill-len 4096 --hw v5e --hw v6e --tp 4
  perfmodel predict model --config ./my-model/config.json --hw v5e
"""


@click.command("model", help=_HELP, short_help="One prefill chunk or decode step of a whole model.")
@click.argument("name", required=False)
@click.option("--config", "config_path", metavar="PATH",
              help="Hugging Face config.json (or a model YAML) instead of NAME.")
@click.option("--phase", type=click.Choice(["prefill", "decode"]), default="decode", show_default=True,
              help="Which step to model.")
@click.option("--batch", type=int, default=None, help="Sequences in the step (default 1).")
@click.option("--context", type=int, default=None,
              help="Decode: KV tokens each sequence attends to (default 1024). Prefill: tokens already cached "
                   "before the chunk (default 0).")
@click.option("--context-lens", default=None, metavar="LIST",
              help="Decode: one context length per sequence, e.g. 4096,100,17 or 2048x31,8192 (VALUExCOUNT).")
@click.option("--context-dist", default=None, metavar="DIST",
              help="Decode: --batch context lengths at the quantiles of uniform:LO:HI, normal:MEAN:STD or "
                   "lognormal:MEDIAN:SIGMA.")
@click.option("--prefill-len", "--chunk", "prefill_len", type=int, default=None,
              help="Prefill: new tokens per sequence in this chunk (default 2048).")
@click.option("--weight-dtype", default="bf16", show_default=True, help="Weights: bf16, fp8, int8, int4, ...")
@click.option("--act-dtype", default="bf16", show_default=True, help="Activations.")
@click.option("--weight-scale", type=click.Choice(["per-channel", "per-block"]), default=None,
              help="Scales of quantized weights (default per-channel): per-block = one per --scale-block rows of K.")
@click.option("--scale-block", type=int, default=None, help="K rows per scale with --weight-scale per-block "
              "(default 128).")
@click.option("--quantize-activations", is_flag=True,
              help="int8 x int8 / int8 x int4 weight GEMMs (with --weight-dtype int8 or int4: w8a8, w4a8): "
                   "activations quantized per token inside each GEMM, as the bundled matmul's "
                   "quantize_activations; MoE expert GEMMs keep float activations.")
@click.option("--kv-dtype", default=None, help="KV cache (default: --act-dtype); int8/fp8 get per-token f32 scales.")
@click.option("--tp", type=int, default=1, show_default=True, help="Tensor-parallel degree (chips over ICI).")
@click.option("--page-size", type=int, default=16, show_default=True, help="KV-cache page size in tokens.")
@click.option("--hbm-utilization", type=float, default=0.9, show_default=True,
              help="Share of HBM usable for weights + KV (vLLM's default is 0.9).")
@click.option("--list", "list_models", is_flag=True, help="List the built-in models and exit (with --json: every "
              "field and its source).")
@click.option("--compile", "with_compile", is_flag=True,
              help="Also compile a reference JAX step with the TPU compiler (libtpu, deviceless; cached) and put "
                   "it beside the analytic one op by op (perfmodel.xla.compare).")
@click.option("--topology", default=None, metavar="SLICE",
              help="With --compile: the slice to compile for, e.g. v5e:2x4 (default: the chip's, grown to --tp).")
@click.option("--kv-layout", type=click.Choice(["paged", "contiguous"]), default="paged", show_default=True,
              help="With --compile: the reference step's KV cache.")
@click.option("--kernels", type=click.Choice(["jnp", "bundled"]), default="jnp", show_default=True,
              help="With --compile: attention in jnp or with the bundled Pallas kernels.")
@predict_options
@user_errors
def model(name: str | None, config_path: str | None, phase: str, batch: int | None, context: int | None,
          context_lens: str | None, context_dist: str | None, prefill_len: int | None, weight_dtype: str,
          act_dtype: str, weight_scale: str | None, scale_block: int | None, quantize_activations: bool,
          kv_dtype: str | None, tp: int, page_size: int,
          hbm_utilization: float, list_models: bool, with_compile: bool, topology: str | None, kv_layout: str,
          kernels: str, hw: tuple[str, ...], sweep: tuple[str, ...], as_json: bool, as_csv: bool) -> None:
    from perfmodel.predict import step_render
    from perfmodel.predict.steps import SWEEPABLE, step_sweep
    from perfmodel.predict.sweep import resolve_chips

    fmt = output_format(as_json, as_csv)
    if list_models:
        from perfmodel.model.configs import all_presets

        presets = all_presets()
        emit(fmt, text=lambda: step_render.models_table(presets),
             json=lambda: [step_render.preset_record(c) for c in presets], csv=lambda: step_render.models_csv(presets))
        return
    if (name is None) == (config_path is None):
        raise InputError("give a model NAME or --config PATH (one of them); --list shows the built-in models")
    if with_compile:
        if weight_scale or scale_block or quantize_activations:
            raise InputError("--weight-scale / --scale-block / --quantize-activations are for the analytic model; the "
                             "compiled reference step uses per-channel scales and float activations: drop them with "
                             "--compile")
        from perfmodel.xla import render as xla_render
        from perfmodel.xla.compare import compare_sweep

        with Progress("compile") as bar:
            items = compare_sweep(config_path or name, chips=resolve_chips(hw), points=sweep_points(sweep, SWEEPABLE),
                                  base=dict(phase=phase, batch=batch, context=context, prefill_len=prefill_len,
                                            weight_dtype=weight_dtype, act_dtype=act_dtype, kv_dtype=kv_dtype,
                                            tp=tp, page_size=page_size),
                                  topology=topology, kv_layout=kv_layout, kernels=kernels,
                                  hbm_utilization=hbm_utilization, progress=bar)
        emit(fmt, text=lambda: xla_render.sweep_text(items),
             json=lambda: [xla_render.comparison_record(p, c) for p, c in items])
        return
    with Progress("predict model", min_total=SWEEP_BAR_POINTS) as bar:
        result = step_sweep(config_path or name, chips=resolve_chips(hw), points=sweep_points(sweep, SWEEPABLE),
                            phase=phase, batch=batch, context=context, context_lens=context_lens,
                            context_dist=context_dist, prefill_len=prefill_len, weight_dtype=weight_dtype,
                            act_dtype=act_dtype, kv_dtype=kv_dtype, tp=tp, page_size=page_size,
                            weight_scale=weight_scale, scale_block=scale_block,
                            quantize_activations=quantize_activations, hbm_utilization=hbm_utilization, progress=bar)
    emit(fmt, text=lambda: step_render.step_text(result), json=lambda: step_render.step_records(result),
         csv=lambda: step_render.step_csv(result))
