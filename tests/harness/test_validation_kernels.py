"""The validation set's own kernel (the matmul guide's variants) is correct, in Pallas interpret mode."""

import numpy as np
import pytest

from perfmodel.harness.validation_kernels import tiled_matmul, tiled_matmul_reference

TOL = {"bfloat16": 2e-2, "float32": 1e-5}


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("transpose_rhs", [False, True])
@pytest.mark.parametrize("activation", ["none", "relu"])
def test_matches_reference(dtype, transpose_rhs, activation):
    import jax.numpy as jnp

    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((32, 256)), dtype)
    y = jnp.asarray(rng.standard_normal((384, 256) if transpose_rhs else (256, 384)), dtype)
    # grid (32/16, 384/128, 256/128) = (2, 3, 2): two K steps exercise the zeroing and the final store.
    got = tiled_matmul(x, y, bm=16, bk=128, bn=128, transpose_rhs=transpose_rhs, activation=activation,
                       interpret=True)
    want = tiled_matmul_reference(x, y, transpose_rhs=transpose_rhs, activation=activation)
    assert got.shape == (32, 384)
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32), rtol=TOL[dtype],
                               atol=TOL[dtype] * 16)
    if activation == "relu":
        assert float(jnp.min(got)) >= 0.0


def test_bad_blocks_and_shapes():
    import jax

    x = jax.ShapeDtypeStruct((256, 256), "bfloat16")
    with pytest.raises(ValueError, match="bk: 96 does not divide 256"):
        tiled_matmul(x, jax.ShapeDtypeStruct((256, 256), "bfloat16"), bm=128, bk=96, bn=128)
    with pytest.raises(ValueError, match=r"y: shape \(128, 256\) does not contract"):
        tiled_matmul(x, jax.ShapeDtypeStruct((128, 256), "bfloat16"), bm=128, bk=128, bn=128)
    with pytest.raises(ValueError, match="activation: 'gelu' is not one of none, relu"):
        tiled_matmul(x, jax.ShapeDtypeStruct((256, 256), "bfloat16"), bm=128, bk=128, bn=128, activation="gelu")
