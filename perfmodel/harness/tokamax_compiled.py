"""Compiler-backed expected times of tokamax's XLA-implementation points (``perfmodel validate --group tokamax
--compile``).

Each recorded XLA call is rebuilt as the JAX function tokamax's XLA implementation runs (the functions below,
one per op, importable as ``perfmodel.harness.tokamax_compiled:NAME`` by the compile worker: arrays as
arguments, everything else static), compiled deviceless with libtpu for the point's chip like
``perfmodel xla MODULE:FUNCTION --hw CHIP`` (:func:`perfmodel.xla.program.build_program`: each op's bundles at the
clock, its HBM bytes at the achievable HBM rate, the larger of the two, summed less hidden DMA), and the program's
step time is the compiler-backed expected time.

One JAX device of a TPU7x (``tpu-7x/core``, one TensorCore) is not a compile target of its own: the program is
compiled for ``tpu-7x`` (libtpu's ``tpu7x:2x2x1``, whose first device, the compile target, is one TensorCore) and
timed on the ``tpu-7x/core`` view (the same clock, one core's share of the HBM bandwidth).

The Pallas points are not compiled: their kernels are tokamax's, and tokamax is not a dependency.

jax is imported inside the functions only (importing this module imports neither jax nor numpy).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

#: Why a point has no compiler-backed time.
PALLAS_REASON = "Pallas implementation: compiled with --pallas analyze (tokamax installed), not on the op-model path"
NOT_SAMPLED = "not in the --sample"
_MODULE = "perfmodel.harness.tokamax_compiled"
#: Recorded dtype names -> `--shape` dtypes.
_SHAPE_DTYPES = {"bf16": "bf16", "f32": "f32", "f16": "f16", "i32": "int32", "bool": "bool"}


# ----------------------------------------------------------------------------- the functions XLA runs


def ragged_dot(lhs: Any, rhs: Any, *, group_sizes: Sequence[int], lhs_contracting: Sequence[int],
               rhs_contracting: Sequence[int], rhs_group: Sequence[int], return_residuals: bool = False) -> Any:
    """tokamax's XLA ragged dot: ``jax.lax.ragged_dot_general`` with the recorded dimension numbers (lhs ragged
    along its rows) and an f32 result (tokamax asks for the promotion of the output dtype and f32), cast back to
    the operands' dtype; with ``return_residuals`` the cast result is returned twice (output and residual). The
    group sizes are a concrete int32 array (the recorded sizes, as tokamax's benchmark passes them)."""
    import jax
    import jax.numpy as jnp

    dn = jax.lax.RaggedDotDimensionNumbers(
        dot_dimension_numbers=((list(lhs_contracting), list(rhs_contracting)), ([], [])),
        lhs_ragged_dimensions=[0], rhs_group_dimensions=list(rhs_group))
    out_dtype = jnp.result_type(lhs, rhs)
    out = jax.lax.ragged_dot_general(lhs, rhs, jnp.asarray(group_sizes, dtype=jnp.int32), dn,
                                     preferred_element_type=jnp.promote_types(out_dtype, jnp.float32))
    out = out.astype(out_dtype)
    return (out, out) if return_residuals else out


def _attention(q: Any, k: Any, v: Any, bias: Any, mask: Any, *, logits_scale: float, is_causal: bool,
               mxu_dtype: str | None, return_residuals: bool) -> Any:
    """tokamax's XLA attention: f32 logits = (q k^T) * scale (+ bias, masked), softmax in f32, probabilities in
    the operand dtype times v. q, k, v are [..., seq, heads, head_dim]; logits [..., heads, q_seq, k_seq]."""
    import jax
    import jax.numpy as jnp

    if mxu_dtype is not None:  # a BF16_BF16_F32 dot: bf16 operands whatever the inputs' dtype
        q, k, v = (a.astype(mxu_dtype) for a in (q, k, v))
    hq, hk = q.shape[-2], k.shape[-2]
    if hk != hq:  # grouped k/v heads broadcast to the query heads
        k, v = (jnp.repeat(a, hq // hk, axis=-2) for a in (k, v))
    logits = jnp.einsum("...qhd,...khd->...hqk", q, k, preferred_element_type=jnp.float32) * logits_scale
    if bias is not None:
        logits = logits + bias.astype(jnp.float32)
    big_neg = jnp.finfo(jnp.float32).min
    if mask is not None:
        logits = jnp.where(mask, logits, big_neg)
    if is_causal:
        s, t = logits.shape[-2:]
        logits = jnp.where(jnp.arange(s)[:, None] >= jnp.arange(t)[None, :], logits, big_neg)
    peak = jnp.max(logits, axis=-1, keepdims=True)
    unnorm = jnp.exp(logits - jax.lax.stop_gradient(peak))
    total = jnp.sum(unnorm, axis=-1, keepdims=True)
    probs = (unnorm / total).astype(v.dtype)
    out = jnp.einsum("...hqk,...khd->...qhd", probs, v, preferred_element_type=jnp.float32).astype(v.dtype)
    if return_residuals:
        return out, (peak[..., 0], total[..., 0])
    return out


def attention(q: Any, k: Any, v: Any, bias: Any = None, mask: Any = None, *, logits_scale: float,
              is_causal: bool = False, mxu_dtype: str | None = None, return_residuals: bool = False) -> Any:
    """Forward of tokamax's XLA attention (see :func:`_attention`); with ``return_residuals`` also the softmax's
    max and sum (what the backward reuses)."""
    return _attention(q, k, v, bias, mask, logits_scale=logits_scale, is_causal=is_causal, mxu_dtype=mxu_dtype,
                      return_residuals=return_residuals)


def attention_vjp(q: Any, k: Any, v: Any, dout: Any, *, logits_scale: float, is_causal: bool = False,
                  mxu_dtype: str | None = None) -> Any:
    """dq, dk, dv of :func:`attention` for the cotangent ``dout`` (jax.vjp: the logits are recomputed)."""
    import jax

    def fwd(q_: Any, k_: Any, v_: Any) -> Any:
        out = _attention(q_, k_, v_, None, None, logits_scale=logits_scale, is_causal=is_causal,
                         mxu_dtype=mxu_dtype, return_residuals=False)
        return out.astype(dout.dtype)

    _, pullback = jax.vjp(fwd, q, k, v)
    return pullback(dout)


def cross_entropy(x: Any, labels: Any, w: Any, *, reduction: str = "mean") -> Any:
    """Forward of tokamax's XLA linear softmax cross-entropy loss, as its reference function computes it: logits =
    x @ w in the operands' promoted dtype (no f32 accumulation asked for), log-softmax, the one-hot loss summed in
    f32 (over the rows for "mean"); the loss in x's dtype, as the recorded calls return it."""
    import jax
    import jax.numpy as jnp

    logits = x @ w
    one_hot = jax.nn.one_hot(labels, num_classes=w.shape[1], dtype=x.dtype)
    total = jnp.sum(-one_hot * jax.nn.log_softmax(logits, axis=-1), dtype=jnp.float32)
    return (total / x.shape[0] if reduction == "mean" else total).astype(x.dtype)


def cross_entropy_vjp(x: Any, labels: Any, w: Any, dout: Any, lse: Any, *, reduction: str = "mean") -> Any:
    """dx, dw of :func:`cross_entropy` as tokamax's reference backward computes them from the forward's
    log-sum-exp ``lse`` (its residual): s = exp(x @ w - lse) - one_hot in the logits' dtype, dx = s w^T, dw = x^T s (over the
    rows for "mean"), each scaled by the cotangent ``dout``."""
    import jax
    import jax.numpy as jnp

    one_hot = jax.nn.one_hot(labels, num_classes=w.shape[1], dtype=x.dtype)
    s = -one_hot + jnp.exp(x @ w - lse[:, None])
    dx, dw = s @ w.T, x.T @ s
    if reduction == "mean":
        dx, dw = dx / x.shape[0], dw / x.shape[0]
    return dout * dx, dout * dw


def layer_norm(x: Any, scale: Any = None, offset: Any = None, *, axis: int = -1, epsilon: float = 1e-6,
               subtract_mean: bool = True, scale_offset: float = 0.0) -> Any:
    """tokamax's XLA normalization: statistics in f32 over ``axis``, (x - mean) / sqrt(var + eps) * (scale +
    scale_offset) + offset, in x's dtype (``subtract_mean`` False: RMS norm)."""
    import jax
    import jax.numpy as jnp

    x32 = x.astype(jnp.float32)
    ax = axis % x.ndim
    if subtract_mean:
        x32 = x32 - jnp.mean(x32, axis=ax, keepdims=True)
    var = jnp.mean(jnp.square(x32), axis=ax, keepdims=True)
    y = x32 * jax.lax.rsqrt(var + epsilon)
    shape = [1] * x.ndim
    shape[ax] = x.shape[ax]
    if scale is not None:
        y = y * (scale.astype(jnp.float32).reshape(shape) + scale_offset)
    if offset is not None:
        y = y + offset.astype(jnp.float32).reshape(shape)
    return y.astype(x.dtype)


def layer_norm_vjp(x: Any, dout: Any, rstddev: Any, mean: Any = None, scale: Any = None, offset: Any = None, *,
                   axis: int = -1, scale_offset: float = 0.0) -> Any:
    """tokamax's XLA normalization backward (NormalizationVjp) from the forward's residuals ``mean`` (None: RMS
    norm) and ``rstddev`` (f32, the normalized axis kept as 1): in f32, x_norm = (x - mean) * rstddev; the
    offset's gradient sums dout and the scale's sums dout * x_norm over every other axis; dx = (dout * (scale +
    scale_offset) - mean over ``axis`` of that times x_norm * x_norm - its mean) * rstddev, in x's dtype."""
    import jax.numpy as jnp

    ax = axis % x.ndim
    others = tuple(a for a in range(x.ndim) if a != ax)
    g = dout.astype(jnp.float32)
    x_norm = x.astype(jnp.float32)
    if mean is not None:
        x_norm = x_norm - mean
    x_norm = x_norm * rstddev
    doffset = None if offset is None else jnp.sum(g, others).astype(offset.dtype)
    dscale = None
    if scale is not None:
        dscale = jnp.sum(g * x_norm, others).astype(scale.dtype)
        g = g * (jnp.expand_dims(scale.astype(jnp.float32), others) + scale_offset)
    dx = g - jnp.mean(g * x_norm, axis=ax, keepdims=True) * x_norm
    if mean is not None:
        dx = dx - jnp.mean(g, axis=ax, keepdims=True)
    return (dx * rstddev).astype(x.dtype), dscale, doffset


def triangle_multiplication(x: Any, mask: Any, projection_in_weights: Any, gate_in_weights: Any,
                            projection_out_weights: Any, gate_out_weights: Any, layernorm_in_scale: Any,
                            layernorm_in_offset: Any, layernorm_out_scale: Any, layernorm_out_offset: Any, *,
                            triangle_type: str, epsilon: float = 1e-6) -> Any:
    """tokamax's XLA triangle multiplication (AlphaFold's triangle update) on x [N, N, C]: layer norm over C;
    sigmoid(x W_gate) * (x W_proj) with both [C, 2, H] weights' halves side by side ([C, 2H]), in f32, cast back;
    transposed to [2, H, N, N] and masked; the triangle GEMM ("cik,cjk->ijc" outgoing, "ckj,cki->ijc" incoming);
    layer norm over H; @ W_out [H, D], times sigmoid(layer-normed x @ W_gate_out [C, D])."""
    import jax
    import jax.numpy as jnp

    h = layernorm_out_scale.shape[0]
    left = layer_norm(x, layernorm_in_scale, layernorm_in_offset, epsilon=epsilon)
    halves = [jnp.concatenate([w[:, 0, :], w[:, 1, :]], axis=-1) for w in (gate_in_weights, projection_in_weights)]
    gate, proj = (jnp.matmul(left, w) for w in halves)
    act = (jax.nn.sigmoid(gate.astype(jnp.float32)) * proj.astype(jnp.float32)).astype(x.dtype)
    act = mask * jnp.transpose(act.reshape(*act.shape[:2], 2, h), (2, 3, 0, 1))  # [2, H, N, N]
    equation = "cik,cjk->ijc" if triangle_type == "outgoing" else "ckj,cki->ijc"
    out = jnp.einsum(equation, act[0], act[1])
    out = layer_norm(out, layernorm_out_scale, layernorm_out_offset, epsilon=epsilon)
    return jnp.dot(out, projection_out_weights) * jax.nn.sigmoid(jnp.dot(left, gate_out_weights))


# ----------------------------------------------------------------------------- recorded call -> compile request


@dataclass(frozen=True, kw_only=True)
class CompiledCall:
    """A recorded XLA call as ``perfmodel xla`` arguments."""

    target: str
    shapes: tuple[str, ...]
    args: tuple[str, ...]

    @property
    def command(self) -> str:
        return (f"perfmodel xla {self.target} " + " ".join(f"--shape {s}" for s in self.shapes) + " "
                + " ".join(f"--arg '{a}'" for a in self.args))


def _shape(name: str, text: str) -> str:
    """``("q", "bf16[8,2048,8,256]")`` -> ``"q=8x2048x8x256:bf16"`` (a scalar: ``scalar``)."""
    dtype, dims = text.split("[", 1)
    dims = dims.rstrip("]")
    return f"{name}={'x'.join(d for d in dims.split(',') if d) or 'scalar'}:{_SHAPE_DTYPES[dtype]}"


def _mxu_dtype(args: dict[str, Any], dtype: str) -> str | None:
    """bf16 operands for a BF16_BF16_F32 dot on non-bf16 inputs; None: the inputs as they are."""
    precision = (args.get("precision") or ["DEFAULT"])[0]
    return "bfloat16" if precision == "BF16_BF16_F32" and dtype != "bf16" else None


def compiled_call(call: dict[str, Any]) -> CompiledCall:
    """The function (of this module) and ``--shape``/``--arg`` texts of one recorded tokamax XLA call (``call``:
    its ``op``, ``pass``, ``implementation`` and ``args`` as recorded); ValueError for a call with no function."""
    from perfmodel.harness.tokamax_validation import group_sizes

    op, args = call["op"], call["args"]
    backward = call["pass"].startswith("vjp")
    if call["implementation"].startswith("pallas"):
        raise ValueError(PALLAS_REASON)
    if op == "ragged_dot" and not backward:
        dn = args["ragged_dot_dimension_numbers"]
        (lc, rc), _ = dn["dot_dimension_numbers"]
        static = {"group_sizes": group_sizes(args["group_sizes"]), "lhs_contracting": list(lc),
                  "rhs_contracting": list(rc), "rhs_group": list(dn["rhs_group_dimensions"]),
                  "return_residuals": bool(args.get("return_residuals"))}
        return CompiledCall(target=f"{_MODULE}:ragged_dot",
                            shapes=(_shape("lhs", args["lhs"]), _shape("rhs", args["rhs"])),
                            args=tuple(f"{k}={v!r}" for k, v in static.items()))
    if op == "attention":
        mask = args.get("mask") or {}
        if any(mask.get(k) is not None for k in ("q_start", "q_end", "k_start", "k_end")) or args.get(
                "logits_soft_cap") is not None or (args.get("dropout_rate") or 0.0) > 0 or args.get("paging_info"):
            raise ValueError("attention with a range mask, soft cap, dropout or paging: no function yet")
        dtype = args["q"].split("[", 1)[0]
        static = {"logits_scale": float(args.get("logits_scale") or 1.0), "is_causal": bool(mask.get("is_causal")),
                  "mxu_dtype": _mxu_dtype(args, dtype)}
        shapes = [_shape(n, args[n]) for n in ("q", "k", "v")]
        if backward:
            return CompiledCall(target=f"{_MODULE}:attention_vjp", shapes=(*shapes, _shape("dout", args["dout"])),
                                args=tuple(f"{k}={v!r}" for k, v in static.items()))
        if args.get("bias"):
            shapes.append(_shape("bias", args["bias"]))
        if mask.get("bool_mask"):
            shapes.append(_shape("mask", mask["bool_mask"]))
        static["return_residuals"] = bool(args.get("return_residuals"))
        return CompiledCall(target=f"{_MODULE}:attention", shapes=tuple(shapes),
                            args=tuple(f"{k}={v!r}" for k, v in static.items()))
    if op == "linear_softmax_cross_entropy_loss":
        shapes = [_shape(n, args[n]) for n in ("x", "labels", "w")]
        static = (f"reduction={args.get('reduction', 'mean')!r}",)
        if backward:
            (lse,) = args["residuals"]
            return CompiledCall(target=f"{_MODULE}:cross_entropy_vjp",
                                shapes=(*shapes, _shape("dout", args["dout"]), _shape("lse", lse)), args=static)
        return CompiledCall(target=f"{_MODULE}:cross_entropy", shapes=tuple(shapes), args=static)
    if op == "normalization":
        params = [_shape(n, args[n]) for n in ("scale", "offset") if args.get(n)]
        axis, scale_offset = int(args.get("axis", -1)), float(args.get("scale_offset") or 0.0)
        if backward:  # residuals: (mean or None, rstddev), as NormalizationVjp takes them
            mean, rstddev = args["residuals"]
            shapes = [_shape("x", args["x"]), _shape("dout", args["dout"]), _shape("rstddev", rstddev),
                      *([_shape("mean", mean)] if mean else []), *params]
            return CompiledCall(target=f"{_MODULE}:layer_norm_vjp", shapes=tuple(shapes),
                                args=(f"axis={axis!r}", f"scale_offset={scale_offset!r}"))
        static = {"axis": axis, "epsilon": float(args.get("epsilon", 1e-6)),
                  "subtract_mean": bool(args.get("subtract_mean", True)), "scale_offset": scale_offset}
        return CompiledCall(target=f"{_MODULE}:layer_norm", shapes=(_shape("x", args["x"]), *params),
                            args=tuple(f"{k}={v!r}" for k, v in static.items()))
    if op == "triangle_multiplication" and not backward:
        names = ("x", "mask", "projection_in_weights", "gate_in_weights", "projection_out_weights",
                 "gate_out_weights", "layernorm_in_scale", "layernorm_in_offset", "layernorm_out_scale",
                 "layernorm_out_offset")
        static = {"triangle_type": str(args["triangle_type"]), "epsilon": float(args.get("epsilon", 1e-6))}
        return CompiledCall(target=f"{_MODULE}:triangle_multiplication",
                            shapes=tuple(_shape(n, args[n]) for n in names),
                            args=tuple(f"{k}={v!r}" for k, v in static.items()))
    raise ValueError(f"{op} {'vjp' if backward else 'fwd'}: no function yet")


def compile_chip(chip_name: str) -> str:
    """The chip the compiler targets for a point's chip: the whole chip for one JAX device of it
    (``tpu-7x/core`` -> ``tpu-7x``: the topology's first device is one TensorCore)."""
    from perfmodel.hw.views import split_device_suffix

    return split_device_suffix(chip_name)[0]


# ----------------------------------------------------------------------------- sampling and compiling


def sample(ids_by_group: dict[str, list[str]], per_group: int | None) -> set[str]:
    """At most ``per_group`` ids of each group, evenly spaced in file order (the first always; deterministic);
    None: all."""
    chosen: set[str] = set()
    for ids in ids_by_group.values():
        n = len(ids)
        if per_group is None or per_group >= n:
            chosen.update(ids)
        else:
            chosen.update(ids[(i * n) // per_group] for i in range(per_group))
    return chosen


@dataclass(frozen=True, kw_only=True)
class CompiledTime:
    """A point's compiler-backed expected time, or why it has none."""

    id: str
    expected_s: float | None
    #: Why there is no time; with one, what to doubt in it (a fusion XLA's cost model gave no estimate for);
    #: else "".
    reason: str = ""
    command: str = ""
    compile_s: float = 0.0
    from_cache: bool = False


def compile_points(points: Sequence[Any], *, jobs: int = 1,
                   progress: Callable[[str], None] | None = None) -> dict[str, CompiledTime]:
    """Compile every point (ValidationPoint with its recorded ``call``) and time its program; point id ->
    CompiledTime. A compile the compiler rejects, or that fails, is that point's reason."""
    from perfmodel.compiler.api import CompileCall, compile_many
    from perfmodel.compiler.toolchain import toolchain
    from perfmodel.errors import PerfmodelError
    from perfmodel.hw.registry import get_chip
    from perfmodel.xla.program import NO_ESTIMATE_NOTE, build_program

    toolchain()  # one line when libtpu is missing
    out: dict[str, CompiledTime] = {}
    todo: dict[str, list[tuple[Any, CompiledCall]]] = {}
    for p in points:
        try:
            todo.setdefault(compile_chip(p.chip), []).append((p, compiled_call(p.call)))
        except ValueError as exc:
            out[p.id] = CompiledTime(id=p.id, expected_s=None, reason=str(exc))
    for chip_name, items in todo.items():
        calls = [CompileCall(kind="function", target=c.target, shapes=c.shapes, args=c.args) for _, c in items]
        reports = compile_many(calls, get_chip(chip_name), jobs=jobs, progress=progress)
        for (p, c), rep in zip(items, reports):
            if isinstance(rep, PerfmodelError):
                out[p.id] = CompiledTime(id=p.id, expected_s=None, reason=str(rep).splitlines()[0], command=c.command)
                continue
            try:
                prog = build_program(rep, get_chip(p.chip))
            except PerfmodelError as exc:
                out[p.id] = CompiledTime(id=p.id, expected_s=None, reason=str(exc).splitlines()[0], command=c.command)
                continue
            doubt = "; ".join(n for n in prog.notes if NO_ESTIMATE_NOTE in n)
            out[p.id] = CompiledTime(id=p.id, expected_s=float(prog.step_s), command=c.command, reason=doubt,
                                     compile_s=float(rep.compile_s), from_cache=bool(rep.from_cache))
    return out


__all__ = ["CompiledCall", "CompiledTime", "attention", "attention_vjp", "compile_chip", "compile_points",
           "compiled_call", "cross_entropy", "cross_entropy_vjp", "layer_norm", "layer_norm_vjp", "ragged_dot", "sample",
           "triangle_multiplication"]
