"""The --shape grammar NAME=DIMS[:DTYPE][=FILL] and what it builds."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from perfmodel.errors import InputError
from perfmodel.schedule.shapes import abstract, materialize, parse_shape


@pytest.mark.parametrize(
    "text,name,shape,dtype,fill",
    [
        ("x=4096x4096:bf16", "x", (4096, 4096), "bfloat16", None),
        ("w=8x128x1024:int8", "w", (8, 128, 1024), "int8", None),
        ("bias=300:f32", "bias", (300,), "float32", None),
        ("x=64x64", "x", (64, 64), "bfloat16", None),  # dtype defaults to bf16
        ("lengths=8:int32=1024", "lengths", (8,), "int32", 1024.0),
        ("page_table=2x4:int32=arange", "page_table", (2, 4), "int32", "arange"),
        ("n=scalar:int32=3", "n", (), "int32", 3.0),
        ("k=2x2:fp8", "k", (2, 2), "float8_e4m3fn", None),
    ],
)
def test_parse_shape(text, name, shape, dtype, fill):
    s = parse_shape(text)
    assert (s.name, s.shape, s.dtype, s.fill) == (name, shape, dtype, fill)


@pytest.mark.parametrize(
    "text,match",
    [
        ("x4096", "expected NAME=DIMS"),
        ("1x=4:bf16", "not a valid argument name"),
        ("x=40x:bf16", "dimensions must be positive integers"),
        ("x=0x4:bf16", "every dimension must be >= 1"),
        ("x=4:bf17", "unknown dtype 'bf17'"),
        ("x=4:int32=lots", "fill 'lots' must be a number"),
    ],
)
def test_parse_shape_errors_name_the_flag(text, match):
    with pytest.raises(InputError, match=f"--shape '{text}'.*{match}"):
        parse_shape(text)


def test_materialize_fills():
    assert isinstance(materialize(parse_shape("x=4x4:bf16")), jax.ShapeDtypeStruct)
    np.testing.assert_array_equal(np.asarray(materialize(parse_shape("t=2x3:int32=arange"))), [[0, 1, 2], [3, 4, 5]])
    np.testing.assert_array_equal(np.asarray(materialize(parse_shape("l=3:int32=7"))), [7, 7, 7])
    np.testing.assert_array_equal(np.asarray(materialize(parse_shape("c=4:int32=arange*16"))), [0, 16, 32, 48])
    r = np.asarray(materialize(parse_shape("r=64:f32=random")), dtype=np.float32)
    assert r.std() > 0.5  # normal samples, not zeros
    assert abstract(parse_shape("t=2x3:int32=arange")).shape == (2, 3)
