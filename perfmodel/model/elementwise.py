"""Per-element costs of the small elementwise ops that ride along bigger ones.

Counts are instructions per output element on the vector unit (f32 ops) and
on the transcendental unit (exp, reciprocal, tanh, rsqrt). They are
estimates of what Mosaic / XLA emit, written down once here so every op
model (GEMM epilogues, SwiGLU, sampling) uses the same figures.
"""

from __future__ import annotations

from dataclasses import dataclass

from perfmodel.errors import InputError


@dataclass(frozen=True, kw_only=True)
class Elementwise:
    name: str
    #: VPU ops per element.
    vpu_ops: int
    #: EUP ops per element.
    eup_ops: int
    #: Extra operand read from HBM: "none", "row" (a [N] vector, e.g. bias) or "full" (an [M, N] array).
    operand: str = "none"
    description: str = ""


EPILOGUES: dict[str, Elementwise] = {
    e.name: e
    for e in (
        Elementwise(name="bias", vpu_ops=1, eup_ops=0, operand="row", description="add a [N] bias"),
        Elementwise(name="residual", vpu_ops=1, eup_ops=0, operand="full", description="add an [M, N] residual"),
        Elementwise(name="relu", vpu_ops=1, eup_ops=0, description="max(x, 0)"),
        # tanh-approximate GELU: x*x*x, fma chain, scale, (1 + t), * 0.5x ~ 7 VPU ops, tanh on the EUP.
        Elementwise(name="gelu", vpu_ops=7, eup_ops=1, description="tanh-approximate GELU"),
        # SiLU = x * sigmoid(x): negate, exp (EUP), add 1, reciprocal (EUP), multiply.
        Elementwise(name="silu", vpu_ops=3, eup_ops=2, description="x * sigmoid(x)"),
        Elementwise(name="sigmoid", vpu_ops=2, eup_ops=2, description="1 / (1 + exp(-x))"),
        Elementwise(name="tanh", vpu_ops=0, eup_ops=1, description="tanh(x)"),
    )
}


def parse_epilogue(epilogue: tuple[str, ...] | list[str] | str, flag: str = "`epilogue`") -> tuple[Elementwise, ...]:
    """Epilogue names (a tuple or a comma list) to their cost records; InputError for unknown names."""
    names = [e.strip() for e in epilogue.split(",")] if isinstance(epilogue, str) else list(epilogue)
    out = []
    for name in names:
        if not name:
            continue
        key = name.lower()
        if key not in EPILOGUES:
            raise InputError(f"{flag}: unknown epilogue '{name}'; use any of {', '.join(EPILOGUES)}")
        out.append(EPILOGUES[key])
    return tuple(out)
