"""``perfmodel predict ...``: the roofline model of inference ops on the command line.

Every subcommand takes --hw (several chips side by side), --sweep
NAME=V1,V2 (cross product; one row per point, bound changes marked), --json
and --csv. Each parses its options and hands them to :mod:`perfmodel.predict`
(the op builders of :mod:`perfmodel.predict.ops`), which returns the result
its renderers print. No numpy, jax or model import until a command runs.
"""

from __future__ import annotations

from typing import Any

import click

from perfmodel.cli.common import emit, output_format, user_errors
from perfmodel.cli.predict_common import check_required, context_options, predict_options, run_op, sweep_points
from perfmodel.cli.predict_model import model as model_command

_DTYPE_HELP = "bf16, fp32, fp16, fp8, int8, int4 (aliases: bfloat16, f32, e4m3, i8, ...)."


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
def predict() -> None:
    """Predict what bounds an op on a chip (roofline: MXU / VPU / EUP / HBM / ICI), how close to peak it
    can get, and why.

    \b
    Examples:
      perfmodel predict gemm --hw v5e -m 8192 -n 8192 -k 8192
      perfmodel predict gemm --hw v5e,v6e -m 1 -n 8192 -k 8192 --rhs-dtype int8
      perfmodel predict decode-attention --hw v5e --context 4096 --batch 32 --q-heads 32 --kv-heads 8
      perfmodel predict decode-attention --context 2048 --sweep batch=1,8,64,256,1024 --q-heads 32 --kv-heads 8
      perfmodel predict sampling --batch 64 --vocab 128256 --top-p 0.9
      perfmodel predict fused rms-norm --tokens 4096 --hidden 8192
      perfmodel predict collective all-reduce --shape 8,4096 --num-chips 8
    """


# ----------------------------------------------------------------------------- gemm


def precision_option(fn: Any) -> Any:
    return click.option("--precision", type=click.Choice(["default", "high", "highest"], case_sensitive=False),
                        default="default", show_default=True,
                        help="The dots' precision (jax.lax.Precision): bf16 passes of an fp32 matmul on a TPU, "
                             "1 / 3 / 6.")(fn)


@predict.command()
@click.option("-m", "--m", "m", type=int, default=None, help="Rows of the activations (tokens). Required.")
@click.option("-n", "--n", "n", type=int, default=None, help="Output features (weight columns). Required.")
@click.option("-k", "--k", "k", type=int, default=None, help="Contraction size. Required.")
@click.option("--batch", type=int, default=1, show_default=True, help="Independent GEMMs (batched matmul).")
@click.option("--lhs-dtype", default="bf16", show_default=True, help="Activations dtype: " + _DTYPE_HELP)
@click.option("--rhs-dtype", default="bf16", show_default=True, help="Weights dtype.")
@click.option("--out-dtype", default="bf16", show_default=True, help="Output dtype (accumulation is f32).")
@click.option("--weight-scale", type=click.Choice(["none", "per-channel", "per-block"]), default=None,
              help="Scales of quantized weights (default per-channel when --rhs-dtype is quantized).")
@click.option("--scale-block", type=int, default=None, help="K rows per scale with --weight-scale per-block (128).")
@click.option("--quantize-activations", is_flag=True, default=None, help="Quantize the activations (read in "
              "--lhs-dtype, bf16 or fp32) per token to int8 codes inside the kernel for the MXU (dynamic quantization "
              "fused in, the bundled matmul's quantize_activations): w8a8 with --rhs-dtype int8, w4a8 with int4.")
@click.option("--epilogue", default="", metavar="LIST", help="Fused epilogue: comma list of bias, residual, relu, "
              "gelu, silu, sigmoid, tanh.")
@click.option("--groups", type=int, default=None, help="Grouped GEMM (mixture of experts, the bundled "
              "grouped_matmul): M rows split evenly over G groups, each times its own [K, N] weights.")
@click.option("--group-sizes", default=None, metavar="LIST", help="Grouped GEMM with these rows per group (comma "
              "list, e.g. 512,0,1536; empty groups cost nothing); M defaults to their sum.")
@click.option("--block-m", type=int, default=None, help="With --groups / --group-sizes: the kernel's row tile; the "
              "MXU then issues a whole tile per group in it (padded rows counted).")
@click.option("--implementation", type=click.Choice(["kernel", "xla"]), default=None, help="With --groups / "
              "--group-sizes: kernel (a grouped-GEMM kernel; default) or xla (jax.lax.ragged_dot as XLA lowers it: "
              "its ragged-dot kernel at the tiles XLA picks, or with --ragged contraction its convolution).")
@click.option("--ragged", type=click.Choice(["rows", "contraction"]), default=None, help="With --groups / "
              "--group-sizes: what the groups split: rows (lhs's M rows, the forward; default) or contraction (the "
              "K rows of both operands, a weight gradient: out[g] = lhs[rows of g]^T @ rhs[rows of g], M x N per "
              "group; K defaults to the sum of the sizes).")
@precision_option
@predict_options
@user_errors
def gemm(hw: tuple[str, ...], sweep: tuple[str, ...], as_json: bool, as_csv: bool, **params: Any) -> None:
    """[batch, M, K] x [batch, K, N] GEMM, f32 accumulation, optional quantization and epilogue; with --groups or
    --group-sizes a grouped GEMM (mixture of experts: rows sorted by expert, one weight matrix per expert)."""
    contraction = params.get("ragged") == "contraction"
    required = (("m", "n") if contraction else ("n", "k")) if params.get("group_sizes") else ("m", "n", "k")
    run_op("gemm", params, hw=hw, sweep=sweep, as_json=as_json, as_csv=as_csv, required=required)


# ----------------------------------------------------------------------------- attention


def _head_options(fn: Any) -> Any:
    fn = click.option("--head-dim", type=int, default=128, show_default=True)(fn)
    fn = click.option("--kv-heads", type=int, default=None, help="KV heads (default: --q-heads, i.e. MHA).")(fn)
    fn = click.option("--q-heads", type=int, default=32, show_default=True)(fn)
    return fn


@predict.command()
@click.option("--batch", type=int, default=1, show_default=True)
@click.option("--q-len", type=int, default=None, help="Query tokens (a prefill chunk). Required.")
@click.option("--kv-len", type=int, default=None, help="Key tokens, prefix included (default: --q-len).")
@_head_options
@click.option("--causal/--no-causal", default=True, show_default=True)
@click.option("--sliding-window", type=int, default=None, help="Attend to the last N keys only.")
@click.option("--dtype", default="bf16", show_default=True, help=_DTYPE_HELP)
@click.option("--block-q", type=int, default=None,
              help="Query block of the kernel (default: the bundled flash_attention's tuned block_q for the chip, "
                   "at most q-len).")
@click.option("--block-kv", type=int, default=None,
              help="KV block of the kernel (default: the bundled kernel's tuned block_kv, at most kv-len).")
@precision_option
@predict_options
@user_errors
def attention(hw: tuple[str, ...], sweep: tuple[str, ...], as_json: bool, as_csv: bool, **params: Any) -> None:
    """Flash-style prefill attention: MHA / GQA / MQA, causal masking waste at the block size."""
    run_op("attention", params, hw=hw, sweep=sweep, as_json=as_json, as_csv=as_csv, required=("q_len",))


@predict.command("chunked-attention")
@click.option("--batch", type=int, default=1, show_default=True)
@click.option("--q-len", type=int, default=None, help="Query tokens. Required.")
@click.option("--kv-len", type=int, default=None, help="Key tokens (default: --q-len).")
@_head_options
@click.option("--v-head-dim", type=int, default=None, help="Value head dim (default: --head-dim).")
@click.option("--chunk", type=int, default=128, show_default=True,
              help="Query and key chunk (tokamax's chunk_size; the cost line was read at 128).")
@click.option("--bias-and-mask", is_flag=True, help="An additive bias and a boolean mask (AlphaFold's attention).")
@click.option("--dtype", default="bf16", show_default=True, help=_DTYPE_HELP)
@predict_options
@user_errors
def chunked_attention(hw: tuple[str, ...], sweep: tuple[str, ...], as_json: bool, as_csv: bool,
                      **params: Any) -> None:
    """XLA's chunked attention (tokamax's xla_chunked: a loop over query and key chunks with an online softmax,
    every chunk pair computed, a causal mask applied, not skipped); TPUs only."""
    run_op("chunked-attention", params, hw=hw, sweep=sweep, as_json=as_json, as_csv=as_csv, required=("q_len",))


def _paged_options(fn: Any) -> Any:
    fn = click.option("--pages-per-seq", type=int, default=None,
                      help="Page-table width (default: the most pages any sequence needs).")(fn)
    fn = click.option("--page-size", type=int, default=16, show_default=True, help="Tokens per KV page.")(fn)
    fn = click.option("--q-dtype", default="bf16", show_default=True)(fn)
    fn = click.option("--kv-dtype", default="bf16", show_default=True, help="KV cache dtype: " + _DTYPE_HELP)(fn)
    return fn


@predict.command("decode-attention")
@context_options
@_head_options
@_paged_options
@click.option("--kv-scale", type=click.Choice(["none", "per-tensor", "per-token", "per-page"]), default=None,
              help="Scales of a quantized KV cache (default per-token for int8/fp8/int4, none otherwise).")
@precision_option
@predict_options
@user_errors
def decode_attention(hw: tuple[str, ...], sweep: tuple[str, ...], as_json: bool, as_csv: bool,
                     **params: Any) -> None:
    """One decode step over a paged KV cache (whole pages, page table, GQA packing)."""
    run_op("decode-attention", params, hw=hw, sweep=sweep, as_json=as_json, as_csv=as_csv)


@predict.command("ragged-attention")
@click.option("--query-lens", required=True, metavar="LIST",
              help="New tokens per sequence; 1 = decode, more = a prefill chunk (e.g. 1x60,512x2).")
@click.option("--context-lens", required=True, metavar="LIST",
              help="Context per sequence, new tokens included (e.g. 4096x60,512x2).")
@_head_options
@_paged_options
@click.option("--kv-scale", type=click.Choice(["none", "per-tensor", "per-token", "per-page"]), default=None)
@click.option("--block-q", type=int, default=None,
              help="Query tokens per prefill block (default: the bundled ragged_paged_attention's tuned block_q for "
                   "the chip).")
@precision_option
@predict_options
@user_errors
def ragged_attention(hw: tuple[str, ...], sweep: tuple[str, ...], as_json: bool, as_csv: bool,
                     **params: Any) -> None:
    """A mixed batch of prefill chunks and decode tokens in one kernel (vLLM TPU style); time split by part."""
    run_op("ragged-attention", params, hw=hw, sweep=sweep, as_json=as_json, as_csv=as_csv)


@predict.command("mla-decode")
@context_options
@click.option("--q-heads", type=int, default=128, show_default=True)
@click.option("--kv-lora-rank", type=int, default=512, show_default=True, help="Latent KV width.")
@click.option("--rope-head-dim", type=int, default=64, show_default=True, help="Shared rope key width.")
@click.option("--page-size", type=int, default=64, show_default=True)
@click.option("--kv-dtype", default="bf16", show_default=True)
@click.option("--q-dtype", default="bf16", show_default=True)
@click.option("--pages-per-seq", type=int, default=None)
@predict_options
@user_errors
def mla_decode(hw: tuple[str, ...], sweep: tuple[str, ...], as_json: bool, as_csv: bool, **params: Any) -> None:
    """DeepSeek-style MLA decode (absorbed form): latent + rope KV per token shared by all heads."""
    run_op("mla-decode", params, hw=hw, sweep=sweep, as_json=as_json, as_csv=as_csv)


# ----------------------------------------------------------------------------- sampling


@predict.command()
@click.option("--batch", type=int, default=None, help="Rows of logits. Required.")
@click.option("--vocab", type=int, default=None, help="Vocabulary size. Required.")
@click.option("--dtype", default="fp32", show_default=True, help="Logits dtype.")
@click.option("--temperature/--greedy", default=True, show_default=True,
              help="Temperature sampling, or greedy argmax (with no filters).")
@click.option("--top-k", type=int, default=None)
@click.option("--top-p", type=float, default=None)
@click.option("--min-p", type=float, default=None)
@click.option("--penalties", is_flag=True, help="Repetition / frequency / presence penalties.")
@click.option("--logit-bias", is_flag=True, help="A [batch, vocab] f32 logit bias (allowed / banned masks folded in).")
@click.option("--logprobs", type=int, default=None,
              help="Log-probabilities of the chosen token and the top N (0: the chosen token's only).")
@click.option("--draft-tokens", type=int, default=None,
              help="Speculative decoding: verify K draft tokens per row with the rejection sampler (target and "
                   "draft probabilities; no filters).")
@click.option("--method", type=click.Choice(["both", "threshold", "sort"]), default="both", show_default=True,
              help="Top-k / top-p algorithm; 'both' shows them side by side.")
@click.option("--passes", type=int, default=None, help="Bisection passes of the threshold method (default: dtype bits).")
@click.option("--projection-hidden", type=int, default=None,
              help="Include the [batch, H] x [H, vocab] logits projection with this hidden size.")
@predict_options
@user_errors
def sampling(hw: tuple[str, ...], sweep: tuple[str, ...], as_json: bool, as_csv: bool, **params: Any) -> None:
    """Sampling from [batch, vocab] logits: bias, penalties, temperature, top-k / top-p / min-p, the draw,
    logprobs; or speculative decoding's rejection sampler (--draft-tokens)."""
    run_op("sampling", params, hw=hw, sweep=sweep, as_json=as_json, as_csv=as_csv, required=("batch", "vocab"))


# ----------------------------------------------------------------------------- kv cache


@predict.group("kv-cache")
def kv_cache() -> None:
    """The paged KV cache: writing new tokens (update), gathering pages (gather), and what fits (capacity)."""


@kv_cache.command("update")
@click.option("--tokens", type=int, default=None, help="New tokens written (per layer). Required.")
@click.option("--kv-heads", type=int, default=8, show_default=True)
@click.option("--head-dim", type=int, default=128, show_default=True)
@click.option("--page-size", type=int, default=16, show_default=True)
@click.option("--kv-dtype", default="bf16", show_default=True)
@click.option("--src-dtype", default="bf16", show_default=True, help="Dtype of the new K / V.")
@click.option("--kv-scale", type=click.Choice(["none", "per-tensor", "per-token"]), default=None,
              help="Quantize-on-write scales (default per-token when the cache is narrower).")
@predict_options
@user_errors
def kv_update(hw: tuple[str, ...], sweep: tuple[str, ...], as_json: bool, as_csv: bool, **params: Any) -> None:
    """Scatter new K / V rows into their page slots, quantizing on write."""
    run_op("kv-cache update", params, hw=hw, sweep=sweep, as_json=as_json, as_csv=as_csv, required=("tokens",))


@kv_cache.command("gather")
@context_options
@click.option("--kv-heads", type=int, default=8, show_default=True)
@click.option("--head-dim", type=int, default=128, show_default=True)
@click.option("--page-size", type=int, default=16, show_default=True)
@click.option("--kv-dtype", default="bf16", show_default=True)
@click.option("--out-dtype", default=None, help="Dtype written (default: the cache dtype).")
@predict_options
@user_errors
def kv_gather_cmd(hw: tuple[str, ...], sweep: tuple[str, ...], as_json: bool, as_csv: bool, **params: Any) -> None:
    """Copy sequences' pages into a contiguous buffer (whole pages read)."""
    run_op("kv-cache gather", params, hw=hw, sweep=sweep, as_json=as_json, as_csv=as_csv)


@kv_cache.command("capacity")
@click.option("--weight-bytes", type=float, default=None, help="Model weight bytes (all chips together).")
@click.option("--params-b", type=float, default=None, help="Or: billions of parameters (with --weight-dtype).")
@click.option("--weight-dtype", default="bf16", show_default=True)
@click.option("--layers", type=int, default=None, help="Required.")
@click.option("--kv-heads", type=int, default=None, help="Required.")
@click.option("--head-dim", type=int, default=128, show_default=True)
@click.option("--kv-dtype", default="bf16", show_default=True)
@click.option("--kv-scale", type=click.Choice(["none", "per-tensor", "per-token"]), default=None,
              help="Scales stored with a quantized KV cache (default per-token f32 when --kv-dtype is 8-bit or less).")
@click.option("--page-size", type=int, default=16, show_default=True)
@click.option("--context", type=int, default=None, help="Tokens per sequence, to count whole sequences.")
@click.option("--num-chips", type=int, default=1, show_default=True, help="Chips the weights and KV shard over.")
@click.option("--hbm-utilization", type=float, default=0.9, show_default=True)
@click.option("--reserved-bytes", type=float, default=0.0, show_default=True,
              help="Per chip: activations / workspace kept free.")
@predict_options
@user_errors
def kv_capacity_cmd(hw: tuple[str, ...], sweep: tuple[str, ...], as_json: bool, as_csv: bool,
                    **params: Any) -> None:
    """How many tokens / sequences of KV fit in HBM next to the weights."""
    from perfmodel.predict import render
    from perfmodel.predict.capacity import NOT_SWEEPABLE, capacity_sweep
    from perfmodel.predict.sweep import resolve_chips

    fmt = output_format(as_json, as_csv)
    points = sweep_points(sweep, [k for k in params if k not in NOT_SWEEPABLE])
    check_required(params, points[0], ("layers", "kv_heads"))
    result = capacity_sweep(params, chips=resolve_chips(hw), points=points)
    emit(fmt, text=lambda: render.capacity_text(result), json=lambda: render.capacity_records(result),
         csv=lambda: render.capacity_csv(result))


# ----------------------------------------------------------------------------- memory ops


@predict.command()
@click.option("--bytes", "array_bytes", type=float, default=None, help="Bytes of the array.")
@click.option("--shape", default=None, metavar="D0,D1,...", help="Or: the array's shape (with --dtype).")
@click.option("--elements", "array_elements", type=int, default=None, help="Or: its element count (with --dtype).")
@click.option("--dtype", default="bf16", show_default=True, help=_DTYPE_HELP)
@click.option("--elementwise", is_flag=True, help="One VPU op per element (x + 1) instead of a plain copy.")
@click.option("--out-dtype", default=None, help="Write each element in this dtype (x.astype; with --shape or "
              "--elements).")
@predict_options
@user_errors
def copy(hw: tuple[str, ...], sweep: tuple[str, ...], as_json: bool, as_csv: bool, **params: Any) -> None:
    """Copy an array HBM to HBM in one op (read once, written once); small copies pay the launch and DMA
    latency, so they stay far from peak bandwidth."""
    run_op("copy", params, hw=hw, sweep=sweep, as_json=as_json, as_csv=as_csv)


@predict.command()
@click.option("--rows", type=int, default=None, help="Rows gathered (tokens of an embedding lookup). Required.")
@click.option("--row-bytes", type=float, default=None, help="Bytes per row.")
@click.option("--row-elements", type=int, default=None, help="Or: elements per row (hidden size; with --dtype).")
@click.option("--dtype", default="bf16", show_default=True, help=_DTYPE_HELP)
@predict_options
@user_errors
def gather(hw: tuple[str, ...], sweep: tuple[str, ...], as_json: bool, as_csv: bool, **params: Any) -> None:
    """Gather rows of a table by int32 index (embedding lookup, jnp.take along axis 0): bound by rows per
    second on a TPU (a fitted per-row issue cost), by bytes on a GPU."""
    run_op("gather", params, hw=hw, sweep=sweep, as_json=as_json, as_csv=as_csv, required=("rows",))


# ----------------------------------------------------------------------------- fused ops


@predict.group()
def fused() -> None:
    """Fused elementwise ops: fused vs unfused HBM traffic side by side."""


@fused.command("rms-norm")
@click.option("--tokens", type=int, default=None, help="Required.")
@click.option("--hidden", type=int, default=None, help="Required.")
@click.option("--dtype", default="bf16", show_default=True)
@click.option("--residual/--no-residual", default=True, show_default=True, help="Residual add before the norm.")
@click.option("--out-dtype", default=None)
@click.option("--subtract-mean", is_flag=True, help="A layer norm: the mean taken off first (unfused: one more "
              "reduction pass).")
@click.option("--backward", is_flag=True, help="The norm's gradient (dx and the weight's, from the forward's f32 "
              "statistics) instead; unfused: XLA's reduction pass and dx pass.")
@click.option("--normalized-axis", type=click.Choice(["last", "leading"]), default="last", show_default=True,
              help="Where the normalized axis lies: the last (lane) axis, whose row sums and broadcasts go "
              "through the XLU, or a leading axis (e.g. axis 0 of [hidden, ...]), summed on the VPU.")
@predict_options
@user_errors
def fused_rms_norm(hw: Any, sweep: Any, as_json: bool, as_csv: bool, **params: Any) -> None:
    """Residual add + RMSNorm (or layer norm, --subtract-mean), or its gradient (--backward)."""
    run_op("rms-norm", params, hw=hw, sweep=sweep, as_json=as_json, as_csv=as_csv, required=("tokens", "hidden"))


def _glu_command(kind: str) -> Any:
    @fused.command(kind, help=f"{'SiLU' if kind == 'swiglu' else 'GELU'}(gate) * up over [tokens, intermediate].")
    @click.option("--tokens", type=int, default=None, help="Required.")
    @click.option("--intermediate", type=int, default=None, help="Required.")
    @click.option("--dtype", default="bf16", show_default=True)
    @predict_options
    @user_errors
    def cmd(hw: Any, sweep: Any, as_json: bool, as_csv: bool, **params: Any) -> None:
        run_op(kind, params, hw=hw, sweep=sweep, as_json=as_json, as_csv=as_csv, required=("tokens", "intermediate"))

    return cmd


_glu_command("swiglu")
_glu_command("geglu")


@fused.command("rope")
@click.option("--tokens", type=int, default=None, help="Required.")
@click.option("--heads", type=int, default=None, help="Required.")
@click.option("--head-dim", type=int, default=128, show_default=True)
@click.option("--rotary-dim", type=int, default=None, help="Rotated dims (default: head dim).")
@click.option("--dtype", default="bf16", show_default=True)
@predict_options
@user_errors
def fused_rope(hw: Any, sweep: Any, as_json: bool, as_csv: bool, **params: Any) -> None:
    """Rotary position embedding with cos / sin tables."""
    run_op("rope", params, hw=hw, sweep=sweep, as_json=as_json, as_csv=as_csv, required=("tokens", "heads"))


@fused.command("dequant-gemm")
@click.option("-m", "--m", "m", type=int, default=None, help="Required.")
@click.option("-n", "--n", "n", type=int, default=None, help="Required.")
@click.option("-k", "--k", "k", type=int, default=None, help="Required.")
@click.option("--weight-dtype", default="int8", show_default=True)
@click.option("--act-dtype", default="bf16", show_default=True)
@click.option("--out-dtype", default="bf16", show_default=True)
@click.option("--weight-scale", type=click.Choice(["none", "per-channel", "per-block"]), default=None)
@click.option("--scale-block", type=int, default=None)
@predict_options
@user_errors
def fused_dequant_gemm(hw: Any, sweep: Any, as_json: bool, as_csv: bool, **params: Any) -> None:
    """Quantized-weight GEMM: dequantize in VMEM (fused) vs a separate dequantize kernel."""
    run_op("dequant-gemm", params, hw=hw, sweep=sweep, as_json=as_json, as_csv=as_csv, required=("m", "n", "k"))


# ----------------------------------------------------------------------------- collectives


@predict.command()
@click.argument("kind", type=click.Choice(["all-gather", "reduce-scatter", "all-reduce"]))
@click.option("--bytes-per-chip", type=float, default=None,
              help="Bytes each chip holds before the op (all-gather: its shard; the others: the full array).")
@click.option("--shape", default=None, metavar="D0,D1,...", help="Or: the per-chip array shape (with --dtype).")
@click.option("--dtype", default="bf16", show_default=True)
@click.option("--num-chips", type=int, default=None, help="Chips on the axis. Required.")
@click.option("--topology", type=click.Choice(["auto", "ring", "line", "torus"]), default="auto", show_default=True,
              help="auto: from the chip spec's topology (torus block, switch, full mesh; DCN between slices); "
                   "ring: one torus axis with wraparound; line: no wraparound; torus: all axes.")
@click.option("--slice-chips", type=int, default=None,
              help="Chips per ICI slice for --topology auto (default: the spec's max_chips_per_pod); "
                   "a larger group goes over DCN between slices.")
@predict_options
@user_errors
def collective(kind: str, hw: Any, sweep: Any, as_json: bool, as_csv: bool, **params: Any) -> None:
    """All-gather, reduce-scatter or all-reduce over ICI (tensor parallelism)."""
    run_op(kind, params, hw=hw, sweep=sweep, as_json=as_json, as_csv=as_csv, required=("num_chips",))


predict.add_command(model_command)
