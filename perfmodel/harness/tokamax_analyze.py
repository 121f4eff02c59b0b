"""tokamax's Pallas points through ``perfmodel.analyze`` on tokamax's own kernels (``perfmodel validate --group
tokamax --pallas analyze``).

Each recorded Pallas call (the op class, its recorded arguments and the block config tokamax timed) is rebuilt
with tokamax's own argument schema, traced under the point's chip and modelled by the schedule model: every
pallas_call it runs, plus the XLA ops around them (the measured span includes them). tokamax is not a perfmodel
dependency; ``make thirdparty-checks`` installs the pinned 0.0.12 into ``.thirdparty/``.

The call goes to the op's forward (``Op._fwd``) with the recorded config, not through ``Op.__call__``: that
asks the default device whether the op runs there, and on a CPU host it does not, although tracing for a TPU
does.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable

from perfmodel.errors import InputError

#: What to run for the analyze path where tokamax cannot be imported.
INSTALL_HINT = ("pip install tokamax==0.0.12 --no-deps, or `make thirdparty-checks` and put .thirdparty/ on "
                "PYTHONPATH")


def require_tokamax() -> None:
    """InputError naming ``--pallas`` when tokamax cannot be imported."""
    try:
        importlib.import_module("tokamax")
    except ImportError as exc:
        raise InputError(f"`pallas` analyze: tokamax is not importable ({exc}); {INSTALL_HINT}; or use "
                         "--pallas op-model", fields=("pallas",)) from None


@dataclass(frozen=True, kw_only=True)
class KernelTime:
    """perfmodel.analyze's figures for one recorded call."""

    floor_s: float
    #: The pallas_calls' expected time plus the XLA ops' around them.
    expected_s: float
    kernels: int


def bound_call(call: dict[str, Any]) -> tuple[Callable[..., Any], list[Any]]:
    """(function of the array arguments, their ShapeDtypeStructs) of a recorded tokamax call: ``call`` has
    ``tokamax_op`` (module.Class), ``config`` (the recorded block config) and ``args`` (tokamax's serialized
    arguments: arrays as ``"bf16[8,128]"``)."""
    import jax
    from tokamax._src.ops import op as op_lib

    module, name = str(call["tokamax_op"]).rsplit(".", 1)
    cls = getattr(importlib.import_module(module), name)
    op = cls(config=cls.config_cls(**call["config"]))
    arguments = dict(op_lib._get_arg_spec_adapter(op).validate_python(call["args"]))
    leaves, tree = jax.tree.flatten(arguments)
    is_array = [isinstance(leaf, jax.ShapeDtypeStruct) for leaf in leaves]

    def fn(*arrays: Any) -> Any:
        it = iter(arrays)
        kwargs = tree.unflatten([next(it) if a else leaf for a, leaf in zip(is_array, leaves)])
        return op._fwd(config=op.config, **kwargs)

    fn.__name__ = name
    return fn, [leaf for a, leaf in zip(is_array, leaves) if a]


def analyze_call(call: dict[str, Any], chip: Any) -> KernelTime:
    """The schedule model's time of a recorded tokamax Pallas call on ``chip`` (a ChipSpec)."""
    from perfmodel.schedule.analyze import analyze

    fn, arrays = bound_call(call)
    analysis = analyze(fn, *arrays, chip=chip)
    floor = sum(k.time.op_floor_s for k in analysis.kernels)
    return KernelTime(floor_s=float(floor), expected_s=float(analysis.total_s), kernels=len(analysis.kernels))


def recorded_call(*, point: str, chip: Any, timings: str | None = None, **arrays: Any) -> Any:
    """Run the recorded Pallas call of the point ``point`` of the shipped subset (or of the timings file
    ``timings``) on ``arrays`` (``a0``, ``a1``, ... in :func:`bound_call`'s order), traced as on ``chip``
    (tokamax's kernels ask the device what TPU they run on): the MODULE:FUNCTION the TPU compiler is handed for
    ``--compile``."""
    from perfmodel.harness.tokamax_subset import recorded_point
    from perfmodel.hw.registry import get_chip
    from perfmodel.schedule.device_kind import as_device

    fn, _ = bound_call(recorded_point(point, timings))
    with as_device(get_chip(chip) if isinstance(chip, str) else chip):
        return fn(*(arrays[f"a{i}"] for i in range(len(arrays))))


#: The MODULE:FUNCTION the TPU compiler is handed for a recorded Pallas point.
COMPILE_TARGET = "perfmodel.harness.tokamax_analyze:recorded_call"
