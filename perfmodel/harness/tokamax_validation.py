"""tokamax's real-TPU timings (the calibration subset shipped in ``perfmodel/data/validation/``) as validation
points of ``perfmodel validate --group tokamax``.

Each timed tokamax call (one jitted op on ONE JAX device: the whole chip on v5e, one of the two TensorCores of a
TPU7x, hence ``tpu-7x/core``) becomes the perfmodel ops that do its work, summed:

* ``ragged_dot`` (both implementations): the grouped GEMM of its group sizes; a ragged contracting dimension (the
  weight-gradient form, out[g] = lhs[rows of g]^T @ rhs[rows of g]) as the grouped GEMM ragged along its
  contraction (one GEMM per group whose K is the group's rows; XLA's convolution for the XLA implementation);
* XLA ``attention``: the two batched GEMMs of logits and output and one elementwise pass over the f32 logits
  (softmax); its ``vjp`` five GEMMs and two passes; the chunked implementation (``xla_chunked``) as XLA's chunk
  loop (:mod:`perfmodel.model.xla_chunked_attention`);
* Pallas ``flash_attention`` forward: the flash-attention op model with the recorded blocks;
* XLA ``linear_softmax_cross_entropy_loss``: the logits GEMM and a pass over the logits (forward), plus the two
  gradient GEMMs (``vjp``);
* ``normalization``: XLA's three passes (mean, variance, normalize);
* XLA ``triangle_multiplication`` (AlphaFold's triangle update): its two layer norms, the four projection GEMMs
  (two fused with a sigmoid gate) and the batched triangle GEMM, with the transpose that feeds it.

What has no op model yet (backward flash attention, the fused Pallas cross-entropy, which never writes its
logits) is listed as not modelled, with the reason. The subset is split in two by a fixed
hash of each point's id: the ``fit`` half is what perfmodel's constants may be fitted on, the other half is held
out; the validation report prints both errors. The rest of tokamax's cache is the held-out set this project is
judged on and is not used here.
"""

from __future__ import annotations

import os
import re
import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np

from perfmodel.harness.published_validation import ValidationPoint
from perfmodel.harness.tokamax_subset import shipped

#: The prefix of every tokamax group (``--group tokamax`` selects them all).
GROUP_PREFIX = "tokamax"
#: Role of the half of the subset constants may be fitted on.
FIT_ROLE = "fit:tokamax-subset"
#: Array dtype names of the recorded arguments -> perfmodel's.
_DTYPES = {"bf16": "bf16", "f32": "fp32", "f16": "fp16", "i32": "int32", "bool": "bool"}
#: Operand dtype of the MXU for a dot precision tokamax records ("BF16_BF16_F32": bf16 operands, f32 sums).
_PRECISION_OPERANDS = {"BF16_BF16_F32": "bf16", "DEFAULT": None}
_ARRAY = re.compile(r"^(\w+)\[([\d,]*)\]$")
#: The lane width of a TPU array's tiled layout: a minor dimension not a multiple of it is kept column-major.
_LANES = 128

Part = tuple[str, dict[str, Any]]


class NotModelled(Exception):
    """A recorded call perfmodel has no op model for (the message says which)."""


@dataclass(frozen=True, kw_only=True)
class Skipped:
    id: str
    group: str
    reason: str


def array(text: str) -> tuple[str, list[int]]:
    """``"bf16[8,2048,8,256]"`` -> ("bf16", [8, 2048, 8, 256])."""
    m = _ARRAY.match(text)
    if m is None:
        raise ValueError(f"not an array spec: {text!r}")
    return _DTYPES[m.group(1)], [int(d) for d in m.group(2).split(",") if d]


def group_sizes(value: Any) -> list[int]:
    """Recorded group sizes: a list, or tokamax's ``{num_groups, total_size}`` whose representative sizes are
    tokamax's ``generate_group_sizes(m=total_size, num_groups, seed=0)``: ``total_size`` draws of a group id,
    uniform with replacement from numpy's default_rng(0), counted per group."""
    if isinstance(value, dict):
        g, m = int(value["num_groups"]), int(value["total_size"])
        ids = np.random.default_rng(0).choice(g, (m,), replace=True)
        return [int(c) for c in np.bincount(ids, minlength=g)]
    return [int(v) for v in value]


def _mxu_dtype(args: dict[str, Any], dtype: str) -> str:
    operands = _PRECISION_OPERANDS.get((args.get("precision") or ["DEFAULT"])[0])
    return operands or dtype


def _ragged_dot(args: dict[str, Any], pallas: bool) -> list[Part]:
    ldt, lhs = array(args["lhs"])
    rdt, rhs = array(args["rhs"])
    dn = args["ragged_dot_dimension_numbers"]
    (lc, rc), _ = dn["dot_dimension_numbers"]
    sizes = group_sizes(args["group_sizes"])
    # tokamax's XLA implementation asks ragged_dot_general for an f32 result and casts it back in a second XLA
    # op; with return_residuals the result is also the residual, a second output buffer (one more copy).
    acc = ldt if pallas else "fp32"
    dtypes = {"lhs_dtype": ldt, "rhs_dtype": rdt, "out_dtype": acc}
    if dn["rhs_group_dimensions"] == [0] and lc == [1] and len(rhs) == 3:
        # out[rows of g] = lhs[rows of g] @ rhs[g] (rhs [G, K, N], or [G, N, K] contracting its last dim).
        m, k = lhs
        n = rhs[2] if rc == [1] else rhs[1]
        # The Pallas kernel's tile_m is not passed as the row tile: counting a tile that straddles two groups
        # once per group puts 7x-rd-fwd-pl-030 (8 groups of the seed-0 sizes, tile_m 512) above its measurement.
        params = {"m": m, "n": n, "k": k, "group_sizes": ",".join(map(str, sizes)), **dtypes}
        if pallas:
            return [("gemm", params)]
        parts: list[Part] = [("gemm", {**params, "implementation": "xla"})]
        # Copies around the kernel in the compiled program (libtpu, deviceless, every subset shape): [G, N, K]
        # weights laid out as [G, K, N] first; and where K or N is not a multiple of 128 (2880), the device
        # keeps the array column-major, so lhs and the weights are re-laid out before the kernel and the
        # result after it.
        unaligned_k, unaligned_n = k % _LANES != 0, n % _LANES != 0
        if rc != [1] or unaligned_k:
            parts.insert(0, ("copy", {"array_elements": int(np.prod(rhs)), "dtype": rdt}))
        if unaligned_k:
            parts.insert(0, ("copy", {"array_elements": m * k, "dtype": ldt}))
        if unaligned_n:
            parts.append(("copy", {"array_elements": m * n, "dtype": ldt}))
        out_elems = m * n
    elif dn["rhs_group_dimensions"] == [] and lc == [0] and rc == [0]:
        # out[g] = lhs[rows of g]^T @ rhs[rows of g]: [K, N] per group, K = lhs's other dim, N = rhs's (the
        # grouped GEMM ragged along its contraction: one GEMM per group in a kernel, XLA's convolution otherwise).
        parts = [("gemm", {"m": lhs[1], "n": rhs[1], "k": lhs[0], "group_sizes": ",".join(map(str, sizes)),
                           "ragged": "contraction", **dtypes, **({} if pallas else {"implementation": "xla"})})]
        if pallas:
            return parts
        out_elems = len(sizes) * lhs[1] * rhs[1]
    else:
        raise NotModelled(f"ragged_dot dimension numbers {dn} (only row-ragged lhs or ragged contraction)")
    parts.append(("copy", {"array_elements": out_elems, "dtype": acc, "out_dtype": ldt}))
    if args.get("return_residuals"):
        parts.append(("copy", {"array_elements": out_elems, "dtype": ldt}))
    return parts


@dataclass(frozen=True, kw_only=True)
class _AttentionShape:
    """A recorded attention call's sizes: q [..., seq, heads, head_dim], k and v [..., kv_seq, kv_heads, .]; the
    leading dims are batch."""

    dtype: str
    batch: int
    q_len: int
    q_heads: int
    head_dim: int
    kv_len: int
    kv_heads: int
    v_head_dim: int


def _attention_shape(args: dict[str, Any]) -> _AttentionShape:
    dt, (*lead, s, hq, d) = array(args["q"])
    _, (*_, t, hkv, _) = array(args["k"])
    _, (*_, dv) = array(args["v"])
    return _AttentionShape(dtype=dt, batch=int(np.prod(lead)), q_len=s, q_heads=hq, head_dim=d, kv_len=t,
                           kv_heads=hkv, v_head_dim=dv)


def _logit_gemms(args: dict[str, Any], backward: bool) -> list[Part]:
    """Attention as XLA runs it: logits = q k^T and out = softmax(logits) v, batched over batch x q heads (k/v
    heads broadcast to the query heads), f32 logits written and read by one softmax pass; the backward recomputes
    the logits and adds dP = dO v^T, dV = P^T dO, dQ = dS k, dK = dS^T q and a second pass (dS)."""
    a = _attention_shape(args)
    dt, b, s, hq, d, t, dv = a.dtype, a.batch, a.q_len, a.q_heads, a.head_dim, a.kv_len, a.v_head_dim
    op_dt = _mxu_dtype(args, dt)
    batch = b * hq
    qk = {"batch": batch, "m": s, "n": t, "k": d, "lhs_dtype": op_dt, "rhs_dtype": op_dt, "out_dtype": "fp32"}
    pv = {"batch": batch, "m": s, "n": dv, "k": t, "lhs_dtype": op_dt, "rhs_dtype": op_dt, "out_dtype": dt}
    softmax = ("copy", {"array_elements": batch * s * t, "dtype": op_dt, "elementwise": True})
    parts: list[Part] = [("gemm", qk), softmax, ("gemm", pv)]
    if backward:
        dp = {**qk}  # dO [s, dv] x v^T [dv, t]
        dvk = {"batch": batch, "m": t, "n": dv, "k": s, "lhs_dtype": op_dt, "rhs_dtype": op_dt, "out_dtype": dt}
        # dS stays f32 (the logits' dtype): dq and dk read it as f32 (the compiled program's bytes, 7x-attn-vjp-
        # xla-023: 28.6 GB, where bf16 dS would be 24.3).
        dq = {"batch": batch, "m": s, "n": d, "k": t, "lhs_dtype": "fp32", "rhs_dtype": op_dt, "out_dtype": dt}
        dk = {"batch": batch, "m": t, "n": d, "k": s, "lhs_dtype": "fp32", "rhs_dtype": op_dt, "out_dtype": dt}
        parts = [("gemm", qk), softmax, ("gemm", dp), ("gemm", dvk), softmax, ("gemm", dq), ("gemm", dk)]
    return parts


def _chunked_attention(args: dict[str, Any]) -> list[Part]:
    """tokamax's XLA chunked attention (``xla_chunked``): XLA's chunk loop at tokamax's default 128 x 128 chunks
    (its ``chunk_size``; the recorded config is empty), with a bias and boolean mask where the call has either."""
    a = _attention_shape(args)
    mask = args.get("mask") or {}
    masked = args.get("bias") is not None or mask.get("bool_mask") is not None
    return [("chunked-attention", {"batch": a.batch, "q_len": a.q_len, "kv_len": a.kv_len, "q_heads": a.q_heads,
                                   "kv_heads": a.kv_heads, "head_dim": a.head_dim, "v_head_dim": a.v_head_dim,
                                   "dtype": a.dtype, **({"bias_and_mask": True} if masked else {})})]


def _flash_attention(args: dict[str, Any], config: dict[str, Any]) -> list[Part]:
    """The flash-attention op model at the recorded blocks, and the XLA passes of tokamax's wrapper around its
    kernel: q scaled by logits_scale, q, k and v transposed from [batch, seq, heads, dim] to the kernel's
    head-major layout and the output transposed back (each one read and one write of the array)."""
    a = _attention_shape(args)
    dt, b, s, hq, d, t, hkv = a.dtype, a.batch, a.q_len, a.q_heads, a.head_dim, a.kv_len, a.kv_heads
    mask = args.get("mask") or {}
    q_elems, kv_elems = b * s * hq * d, b * t * hkv * d

    def one_pass(elems: int) -> Part:
        return ("copy", {"array_elements": elems, "dtype": dt, "elementwise": True})

    kernel = ("attention", {"batch": b, "q_len": s, "kv_len": t, "q_heads": hq, "kv_heads": hkv, "head_dim": d,
                            "causal": bool(mask.get("is_causal")), "dtype": dt,
                            "block_q": int(config["block_q"]), "block_kv": int(config["block_kv"])})
    return [one_pass(q_elems), one_pass(q_elems), one_pass(kv_elems), one_pass(kv_elems), kernel, one_pass(q_elems)]


def _cross_entropy(args: dict[str, Any], backward: bool) -> list[Part]:
    """tokamax's XLA cross-entropy (its reference functions): logits = x @ w in the operands' promoted dtype (bf16
    when x and w are bf16, f32 when x is f32: no f32 accumulation asked for), one pass over them (log-softmax,
    the one-hot loss, log-sum-exp); the backward recomputes them, s = exp(logits - lse) - one_hot in that dtype,
    and dx = s w^T, dw = x^T s, both scaled by the cotangent (recorded in x's dtype), in their promoted dtype."""
    xdt, (b, h) = array(args["x"])
    wdt, (_, v) = array(args["w"])
    act = _promoted(xdt, wdt)
    logits = ("gemm", {"m": b, "n": v, "k": h, "lhs_dtype": xdt, "rhs_dtype": wdt, "out_dtype": act})
    softmax = ("copy", {"array_elements": b * v, "dtype": act, "elementwise": True})
    if not backward:
        return [logits, softmax]
    out = _promoted(act, array(args["dout"])[0]) if args.get("dout") else act
    dx = ("gemm", {"m": b, "n": h, "k": v, "lhs_dtype": act, "rhs_dtype": wdt, "out_dtype": out})
    dw = ("gemm", {"m": h, "n": v, "k": b, "lhs_dtype": xdt, "rhs_dtype": act, "out_dtype": out})
    return [logits, softmax, dx, dw]


def _promoted(a: str, b: str) -> str:
    """jnp's promotion of two float dtypes: the same, or f32 for two different ones (bf16 and f16 included)."""
    return a if a == b else "fp32"


def _normalization(args: dict[str, Any], backward: bool) -> list[Part]:
    """tokamax's XLA normalization as XLA compiles it: statistics in f32, each its own reduction pass over x
    (the mean where ``subtract_mean``, then the variance), then the normalizing pass that writes the output
    (three fusions in the compiled program of every subset point); the normalized axis is ``hidden``. The
    backward (NormalizationVjp, from the forward's f32 statistics): a reduction pass over x and the cotangent,
    then the dx pass (two fusions in the compiled program of every shape of tokamax's benchmark)."""
    dt, dims = array(args["x"])
    axis = int(args.get("axis", -1)) % len(dims)
    hidden = dims[axis]
    return [_layer_norm(int(np.prod(dims)) // hidden, hidden, dt, bool(args.get("subtract_mean", True)),
                        backward=backward, lane_axis=axis == len(dims) - 1)]


def _layer_norm(rows: int, hidden: int, dtype: str, subtract_mean: bool = True, backward: bool = False,
                lane_axis: bool = True) -> Part:
    """XLA's layer norm (RMS norm without ``subtract_mean``) over [rows, hidden]: the f32 statistics passes and
    the normalizing pass (``backward``: its gradient's reduction and dx passes); ``lane_axis`` False: the
    normalized axis is a leading one."""
    return ("rms-norm", {"tokens": rows, "hidden": hidden, "dtype": dtype, "residual": False,
                         "subtract_mean": subtract_mean, "form": "unfused", **({"backward": True} if backward else {}),
                         **({} if lane_axis else {"normalized_axis": "leading"})})


def _triangle_multiplication(args: dict[str, Any]) -> list[Part]:
    """tokamax's XLA triangle multiplication over x [N, N, C] as XLA compiles it (libtpu, deviceless, 7x-tri-fwd-
    xla-002, N = 384): a layer norm over C (its statistics passes; the normalized x is what the GEMMs read);
    left/right projections and their gates, x [N^2, C] @ [C, 2H] twice, the second fused with sigmoid(gate) *
    projection (reading the first's output); the transpose to [2, H, N, N] with the mask multiplied in; the
    triangle itself, H batched [N, N] x [N, N] GEMMs ("cik,cjk->ijc" outgoing, "ckj,cki->ijc" incoming: the same
    work); a layer norm over H; the output projection [N^2, H] @ [H, D]; and the output gate [N^2, C] @ [C, D]
    fused with its sigmoid and the product. All in x's dtype (``precision`` DEFAULT), f32 statistics."""
    dt, (n, n2, c) = array(args["x"])
    _, (_, two, h) = array(args["projection_in_weights"])
    _, (_, d) = array(args["gate_out_weights"])
    rows = n * n2

    def proj(k: int, width: int, gated: bool = False) -> Part:
        epilogue = ["sigmoid", "residual"] if gated else []
        return ("gemm", {"m": rows, "n": width, "k": k, "lhs_dtype": dt, "rhs_dtype": dt, "out_dtype": dt,
                         "epilogue": epilogue})

    return [_layer_norm(rows, c, dt), proj(c, two * h), proj(c, two * h, gated=True),
            ("copy", {"array_elements": rows * two * h, "dtype": dt, "elementwise": True}),
            ("gemm", {"batch": h, "m": n, "n": n2, "k": n, "lhs_dtype": dt, "rhs_dtype": dt, "out_dtype": dt}),
            _layer_norm(rows, h, dt), proj(h, d), proj(c, d, gated=True)]


def parts_of(op: str, backward: bool, implementation: str, args: dict[str, Any],
             config: dict[str, Any]) -> list[Part]:
    """The perfmodel ops (predict op name, parameters) whose times add up to one recorded tokamax call."""
    pallas = implementation.startswith("pallas")
    if op == "ragged_dot" and not backward:
        return _ragged_dot(args, pallas)
    if op == "attention" and implementation == "xla_chunked" and not backward:
        return _chunked_attention(args)
    if op == "attention" and not pallas:
        return _logit_gemms(args, backward)
    if op == "flash_attention" and pallas and not backward:
        return _flash_attention(args, config)
    if op == "linear_softmax_cross_entropy_loss" and not pallas:
        return _cross_entropy(args, backward)
    if op == "normalization" and not pallas:
        return _normalization(args, backward)
    if op == "triangle_multiplication" and not pallas and not backward:
        return _triangle_multiplication(args)
    raise NotModelled(f"{op} {'vjp' if backward else 'fwd'} ({implementation}): no op model yet")


def device_chip(device_kind: str) -> tuple[str, str]:
    """(perfmodel chip of ONE JAX device of ``device_kind``, its short name in group names) through the registry:
    the whole chip where it is one device (TPU v5e: "tpu-v5e", "v5e"), one TensorCore where each is its own device
    (TPU7x: "tpu-7x/core", "7x")."""
    from perfmodel.hw.registry import get_chip

    spec = get_chip(device_kind)
    name = f"{spec.name}/core" if spec.cores.jax_devices_per_chip > 1 else spec.name
    return name, spec.name.removeprefix(f"{spec.kind}-")


def group_name(chip_short: str, op: str, backward: bool, implementation: str) -> str:
    impl = "pallas" if implementation.startswith("pallas") else implementation.replace("_", "-")
    short = {"linear_softmax_cross_entropy_loss": "cross-entropy"}.get(op, op.replace("_", "-"))
    return f"{GROUP_PREFIX}-{chip_short}-{short}-{'vjp' if backward else 'fwd'}-{impl}"


def role(point_id: str) -> str:
    """The fixed split of the subset: even CRC-32 of the id -> fit, odd -> held out."""
    return FIT_ROLE if zlib.crc32(point_id.encode()) % 2 == 0 else "held-out"


#: How a Pallas point is modelled: by the op models of the work it does (no tokamax needed), or by
#: perfmodel.analyze on tokamax's own kernel at the recorded config (:mod:`perfmodel.harness.tokamax_analyze`).
PALLAS_PATHS = ("op-model", "analyze")


def _at(path: str, lines: list[int], i: int) -> str:
    """``PATH:LINE`` of a timings file's point ``i`` (its index in ``points``)."""
    return f"{path}:{lines[i] if i < len(lines) else '?'}"


#: Fields every point of a timings file carries (the subset's format).
POINT_FIELDS = ("id", "chip", "op", "pass", "implementation", "tokamax_op", "args", "measured")


def read_timings(path: str) -> tuple[dict[str, Any], list[int]]:
    """A timings file in the subset's format (``points``: each with :data:`POINT_FIELDS`, ``measured.median_ms``
    in ms; ``cite_as`` optional), and the 1-based line of each point; InputError naming the file and line and the
    fix otherwise."""
    from perfmodel.errors import InputError
    from perfmodel.harness.sources import load_points_yaml
    from perfmodel.inputcheck import read_text

    data, lines = load_points_yaml(read_text(path, "`tokamax-file`"), str(path), fields=("tokamax_file",))
    if not isinstance(data, dict) or not isinstance(data.get("points"), list) or not data["points"]:
        raise InputError(f"{path}: expected tokamax timings with a non-empty 'points' list (the format of "
                         "perfmodel/data/validation/tokamax_tpu_calibration.yaml)", fields=("tokamax_file",))
    seen: set[str] = set()
    for i, p in enumerate(data["points"]):
        where = _at(path, lines, i)
        missing = [f for f in POINT_FIELDS if not isinstance(p, dict) or f not in p]
        if missing:
            raise InputError(f"{where}: point {i + 1} lacks {', '.join(missing)} (every point needs "
                             f"{', '.join(POINT_FIELDS)})", fields=("tokamax_file",))
        ms = p["measured"].get("median_ms") if isinstance(p["measured"], dict) else None
        if isinstance(ms, bool) or not isinstance(ms, (int, float)) or not np.isfinite(ms) or ms <= 0:
            raise InputError(f"{where}: point '{p['id']}': measured.median_ms must be a positive number of "
                             f"milliseconds, got {ms!r}", fields=("tokamax_file",))
        if p["id"] in seen:
            raise InputError(f"{where}: point id '{p['id']}' appears twice; ids must be unique",
                             fields=("tokamax_file",))
        seen.add(p["id"])
    return data, lines


def load_points(text: str | None = None, *, pallas: str = "op-model",
                path: str | None = None) -> tuple[list[ValidationPoint], list[Skipped]]:
    """Every point of the shipped subset (or of ``text``, or of the timings file ``path``: see
    :func:`read_timings`; all its points are held out, nothing was fitted on them) as a ValidationPoint, and the
    points with no model. ``pallas``: one of :data:`PALLAS_PATHS`; with "analyze" every Pallas point (backward
    ones and the fused cross-entropy too) is modelled by perfmodel.analyze on tokamax's kernel."""
    import yaml

    from perfmodel.errors import InputError

    lines: list[int] = []
    if path is not None:
        data, lines = read_timings(path)
    else:
        data = shipped() if text is None else yaml.safe_load(text)
    cite = data.get("cite_as") or (path or "tokamax timings")
    points, skipped = [], []
    for i, p in enumerate(data["points"]):
        try:
            chip, short = device_chip(str(p["chip"]))
            backward = str(p["pass"]).startswith("vjp")
            group = group_name(short, str(p["op"]), backward, str(p["implementation"]))
            kernel = pallas == "analyze" and str(p["implementation"]).startswith("pallas")
            try:
                parts = parts_of(p["op"], backward, p["implementation"], p["args"], p.get("config") or {})
            except NotModelled as e:
                if not kernel:
                    skipped.append(Skipped(id=p["id"], group=group, reason=str(e)))
                    continue
                parts = []  # analyze models it; it has no op model to floor it with
        except (KeyError, ValueError, TypeError, IndexError, InputError) as exc:
            if path is None:
                raise
            where = _at(path, lines, i)
            why = f"no {exc} in its args" if isinstance(exc, KeyError) else (str(exc).splitlines() or [repr(exc)])[0]
            raise InputError(f"{where}: point '{p['id']}': {why}; check its chip, op and args against the subset's "
                             "format", fields=("tokamax_file",)) from None
        points.append(ValidationPoint(
            id=p["id"], group=group, chip=chip, source=f"{cite}: {p.get('src', p['id'])}",
            role="held-out" if path is not None else role(p["id"]),
            measured_s=float(p["measured"]["median_ms"]) * 1e-3, includes_dispatch=False,
            timed=f"tokamax {p['op']} {p['pass']} ({p['implementation']}), device span of one jitted call",
            parts=tuple(parts), tokamax_kernel=kernel,
            call={**{k: p[k] for k in ("op", "pass", "implementation", "args")},
                  "tokamax_op": p["tokamax_op"], "config": p.get("config") or {},
                  **({"timings_file": os.path.abspath(path)} if path is not None else {})}))
    return points, skipped
