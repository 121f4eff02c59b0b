"""Where measurement records come from: results files of `perfmodel measure` and published-measurement YAMLs.

:func:`load_results` reads any mix of them (what ``compare``, ``calibrate``
and ``report`` take); :func:`published_records` converts a published YAML
(perfmodel/data/validation/tpu_v5e_matmul.yaml's format) into records
predicted with the schedule model. Reading a results file needs no jax; a
published YAML runs the schedule model (jax, imported when it runs).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Sequence

from perfmodel.errors import InputError
from perfmodel.inputcheck import dimension, elements, finite, read_text, short
from perfmodel.harness.measure import op_model_prediction, predict_call
from perfmodel.harness.records import ArraySpec, Loaded, Located, Record, Timing, efficiency, read_records


def load_results(paths: Sequence[str | os.PathLike]) -> Loaded:
    """Records of results files (.jsonl) and published-measurement YAMLs (.yaml, converted with the schedule
    model; that needs jax, a results file does not). InputError when nothing is left."""
    items: list[Located] = []
    warnings: list[str] = []
    for path in paths:
        if str(path).endswith((".yaml", ".yml")):
            loaded = published_records(path)
        else:
            loaded = read_records(path)
        items += loaded.items
        warnings += loaded.warnings
    if not items:
        raise InputError(f"{short(', '.join(map(str, paths)))}: no measurement records")
    _check_chips(items)
    return Loaded(items=tuple(items), warnings=tuple(warnings))


def _check_chips(items: Sequence[Located]) -> None:
    """Every real-TPU record's prediction chip is one perfmodel knows (compare, calibrate and report look up its
    roofs); InputError naming the record's file:line otherwise."""
    from perfmodel.errors import PerfmodelError
    from perfmodel.hw.registry import get_chip

    known: set[str] = set()
    for item in items:
        chip = item.record.prediction.chip
        if not item.record.is_real or chip in known:
            continue
        try:
            get_chip(chip)
        except PerfmodelError as exc:
            raise InputError(f"{item.where}: field 'prediction.chip' is {short(repr(chip), 40)}: "
                             f"{str(exc).split('known chips')[0].rstrip('; ')}; see `perfmodel hw list`") from None
        known.add(chip)


def published_records(path: str | Path) -> Loaded:
    """Records of a published-measurement YAML (perfmodel/data/validation/tpu_v5e_matmul.yaml's format).

    Pallas points are JAX's example matmul (the catalog's ``jax-matmul``) at the
    given blocks, predicted by the schedule model (traced with jax, nothing
    runs); XLA points (``kernel: xla``) by the op model. The figures are means
    of timed calls with dispatch included: the dispatch estimate is
    :data:`perfmodel.schedule.timing.DEFAULT_HOST_DISPATCH`, as in the schedule
    model's own calibration.
    """
    from perfmodel.model.gemm import gemm
    from perfmodel.schedule.analyze import resolve_chip
    from perfmodel.schedule.catalog import get_entry
    from perfmodel.schedule.shapes import parse_shape
    from perfmodel.schedule.timing import DEFAULT_HOST_DISPATCH

    p = Path(path)
    data, lines = load_points_yaml(read_text(p), str(p))
    if not isinstance(data, dict) or not isinstance(data.get("points"), list) or "chip" not in data:
        raise InputError(f"{p}: expected a published-measurement file with 'chip', 'source' and 'points' "
                         "(like perfmodel/data/validation/tpu_v5e_matmul.yaml)")
    chip = resolve_chip(str(data["chip"]))
    source = data.get("source") or {}
    citation = ", ".join(str(source[k]) for k in ("title", "url") if k in source) or str(p)
    calls = re.search(r"over (\d+) calls", str(source.get("measurement", "")))
    dispatch = DEFAULT_HOST_DISPATCH
    items = []
    for i, point in enumerate(data["points"]):
        where = f"{p}:{lines[i]}" if i < len(lines) else f"{p}: points[{i}]"
        try:
            m, n, k = (dimension(point[d], f"{where}: field '{d}'") for d in ("m", "n", "k"))
            kind = str(point["kernel"])
            measured_s = finite(point["measured_ms"], f"{where}: field 'measured_ms'", positive=True) * 1e-3
        except (KeyError, TypeError):
            raise InputError(f"{where}: a point needs kernel, m, n, k and measured_ms") from None
        elements((m, k), f"{where}: matrix")
        elements((k, n), f"{where}: matrix")
        x = parse_shape(f"x={m}x{k}:bf16")
        y = parse_shape(f"y={k}x{n}:bf16")
        if kind == "pallas":
            entry = get_entry("jax-matmul")
            try:
                blocks = {b: dimension(point[b], f"{where}: field '{b}'") for b in ("bm", "bk", "bn")}
            except (KeyError, TypeError):
                raise InputError(f"{where}: a pallas point needs bm, bk and bn") from None
            pred = predict_call(entry, {"x": x, "y": y}, blocks, chip, {}, dispatch_s=dispatch.seconds)
            name, function = entry.name, entry.function
        elif kind == "xla":
            cost = gemm(m=m, n=n, k=k, lhs_dtype="bf16", rhs_dtype="bf16", out_dtype="bf16", chip=chip)
            pred = op_model_prediction(cost, chip, dispatch_s=dispatch.seconds)
            name, function, blocks = "xla-matmul", "jax.numpy:matmul", None
        else:
            raise InputError(f"{where}: field 'kernel' is '{short(kind, 40)}'; expected 'pallas' or 'xla'")
        t = Timing(statistic="mean", measured_s=measured_s, repeats=int(calls.group(1)) if calls else 0,
                   includes_dispatch=True, dispatch_s=dispatch.seconds, dispatch_source=dispatch.source)
        record = Record(
            kernel=name, function=function,
            arrays=(ArraySpec(name="x", shape=(m, k), dtype=x.dtype), ArraySpec(name="y", shape=(k, n), dtype=y.dtype)),
            blocks=blocks, backend="tpu", device_kind=(chip.jax_device_kinds or [chip.name])[0],
            device_chip=chip.name, mode="compiled", source=f"published: {citation}", timing=t, prediction=pred,
            efficiency=efficiency(pred, measured_s, mode="compiled", device_chip=chip.name),
            notes=(f"published figure ({source.get('measurement', 'method not stated')})",),
        )
        items.append(Located(where=where, record=record))
    return Loaded(items=tuple(items))


def load_points_yaml(text: str, where: str, fields: tuple[str, ...] = ()) -> tuple[Any, list[int]]:
    """A YAML file's content and the 1-based line of each item of its top-level 'points' list; InputError
    "WHERE:LINE: not valid YAML (...)" (naming ``fields``) when it does not parse."""
    import yaml

    try:
        return yaml.safe_load(text), point_lines(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f"{where}:{mark.line + 1}" if mark is not None else where
        raise InputError(f"{at}: not valid YAML ({getattr(exc, 'problem', exc)})", fields=fields) from None


def point_lines(text: str) -> list[int]:
    """1-based line of each item of the top-level 'points' list."""
    import yaml

    root = yaml.compose(text)
    if not isinstance(root, yaml.MappingNode):
        return []
    for key, value in root.value:
        if key.value == "points" and isinstance(value, yaml.SequenceNode):
            return [item.start_mark.line + 1 for item in value.value]
    return []
