"""Programs for a whole slice, built inside the compile worker (imports jax): a MODULE:FUNCTION with its arrays
placed on a 1-D mesh ``("tp",)`` of the slice's chips, or the reference model step.

``--shard NAME=SPEC`` places array NAME: SPEC lists one entry per dimension,
``tp`` (split over every chip of the slice) or ``_`` (whole), e.g.
``--shard w=_,tp`` splits w's columns; arrays without one are replicated.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from perfmodel.errors import InputError


def parse_shard(texts: Sequence[str], names: Sequence[str], ranks: dict[str, int]) -> dict[str, tuple]:
    """NAME=SPEC texts -> PartitionSpec entries per array; InputError naming `shard` on a mistake."""
    out: dict[str, tuple] = {}
    for t in texts:
        name, sep, spec = t.partition("=")
        name = name.strip()
        if not sep or name not in names:
            raise InputError(f"`shard` '{t}': write NAME=SPEC with NAME one of the --shape arrays "
                             f"({', '.join(names)}) and SPEC like _,tp")
        parts = tuple(None if p.strip() in ("_", "") else p.strip() for p in spec.split(","))
        if len(parts) != ranks[name] or any(p not in (None, "tp") for p in parts):
            raise InputError(f"`shard` '{t}': give one entry per dimension of {name} ({ranks[name]}), each tp or _")
        out[name] = parts
    return out


def slice_program(call: dict[str, Any], chip: Any, devices: list[Any]) -> tuple[Callable, list[Any], tuple[int, ...]]:
    """(function, abstract arguments with shardings, donated argument numbers) of a worker request's call."""
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    if call["kind"] == "model":
        from perfmodel.model import configs
        from perfmodel.model.step import make_step
        from perfmodel.xla.reference import build_step

        params = dict(call.get("args") or {})
        kv_layout = params.pop("kv_layout", "paged")
        kernels = params.pop("kernels", "jnp")
        cfg = configs.get_model(call["model"])
        return build_step(cfg, make_step(**params), devices, kv_layout=kv_layout, kernels=kernels, chip=chip)
    from perfmodel.schedule.binding import bind_arrays
    from perfmodel.schedule.shapes import parse_shape

    fn, specs, _values = bind_arrays(call["target"], call["shapes"], call.get("args", []), chip)
    mesh = Mesh(np.array(devices), ("tp",))
    free = {s.name: len(s.shape) for s in specs}
    shard = parse_shard(call.get("shard", []), [parse_shape(t).name for t in call["shapes"]],
                        {parse_shape(t).name: len(parse_shape(t).shape) for t in call["shapes"]})
    missing = [n for n in shard if n not in free]
    if missing:
        raise InputError(f"`shard` {missing[0]}: the array has a FILL (a constant baked into the program); "
                         "only abstract arrays can be placed")
    args = [jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=NamedSharding(mesh, P(*shard.get(s.name, ()))))
            for s in specs]
    return fn, args, ()
