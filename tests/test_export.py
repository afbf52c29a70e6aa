"""jax.export of functions that use jaxdnn: jaxdnn.export_safety_checks() lists its FFI targets,
whose names carry the FFI version; a serialized train step deserializes and runs, equal to the
original."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxdnn

from util import assert_close, rand


def _net(params, x):
    w, scale, bias = params
    y = jaxdnn.conv(x, w, padding="SAME")
    y, _, _ = jaxdnn.batch_norm(y, scale, bias)
    y = jaxdnn.max_pool(jaxdnn.relu(y), (2, 2))
    return jaxdnn.log_softmax(y.reshape(y.shape[0], -1))


def _train_step(params, x, labels):
    def loss(params):
        return -jnp.mean(jnp.take_along_axis(_net(params, x), labels[:, None], axis=1))

    value, grads = jax.value_and_grad(loss)(params)
    return value, jax.tree.map(lambda p, g: p - 0.1 * g, params, grads)


def _args():
    rng = np.random.default_rng(0)
    params = (jnp.asarray(rand(rng, (3, 3, 3, 4), scale=0.3)),
              jnp.asarray(rand(rng, (4,), offset=1.0)), jnp.asarray(rand(rng, (4,))))
    x = jnp.asarray(rand(rng, (4, 6, 6, 3)))
    labels = jnp.asarray(rng.integers(0, 36, 4), jnp.int32)
    return params, x, labels


def test_safety_checks_name_every_versioned_target():
    info = jaxdnn.build_info()
    version, targets = info["ffi_version"], info["ffi_targets"]
    assert isinstance(version, int) and version >= 1
    assert targets and all(re.fullmatch(rf"jaxdnn_[a-z0-9_]+_v{version}", t) for t in targets)
    checks = jaxdnn.export_safety_checks()
    assert all(isinstance(c, jax.export.DisabledSafetyCheck) for c in checks)
    assert sorted(c.is_custom_call() for c in checks) == sorted(targets)
    for op in ("conv_fwd", "conv_bwd_data", "conv_bwd_filter", "norm_fwd", "norm_bwd",
               "pool_max_fwd_index", "pool_max_scatter", "activation_fwd", "activation_bwd",
               "softmax_fwd", "softmax_bwd"):
        assert f"jaxdnn_{op}_v{version}" in targets, op


def test_train_step_round_trip():
    args = _args()
    step = jax.jit(_train_step)
    exported = jax.export.export(step, disabled_checks=jaxdnn.export_safety_checks())(*args)
    text = exported.mlir_module()
    version = jaxdnn.build_info()["ffi_version"]
    # (a two-call norm algorithm, as the GPU's heuristic picks here, lowers the training
    # forward to its statistics and apply targets)
    for target in ("conv_fwd", "conv_bwd_filter", "norm_fwd(_stats)?", "norm_bwd",
                   "pool_max_fwd_index", "pool_max_scatter", "activation_fwd", "activation_bwd"):
        assert re.search(f"@jaxdnn_{target}_v{version}\\b", text), target
    restored = jax.export.deserialize(exported.serialize())
    got, want = restored.call(*args), step(*args)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # and the step is right: the same step on jax.lax / jax.nn in float64
    ref = _reference_step(*jax.tree.map(lambda a: np.asarray(a, np.float64)
                                        if a.dtype != np.int32 else a, args))
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(ref)):
        assert_close(a, b, jnp.float32, k=27)


def _reference_step(params, x, labels):
    def net(params):
        w, scale, bias = params
        y = jax.lax.conv_general_dilated(x, w, (1, 1), "SAME",
                                         dimension_numbers=("NHWC", "HWIO", "NHWC"))
        mean, var = jnp.mean(y, (0, 1, 2)), jnp.var(y, (0, 1, 2))
        y = (y - mean) / jnp.sqrt(var + 1e-5) * scale + bias
        y = jax.lax.reduce_window(jax.nn.relu(y), -jnp.inf, jax.lax.max, (1, 2, 2, 1),
                                  (1, 2, 2, 1), "VALID")
        return jax.nn.log_softmax(y.reshape(y.shape[0], -1))

    def loss(params):
        return -jnp.mean(jnp.take_along_axis(net(params), labels[:, None], axis=1))

    value, grads = jax.value_and_grad(loss)(params)
    return value, jax.tree.map(lambda p, g: p - 0.1 * g, params, grads)


def test_export_without_the_checks_is_refused():
    with pytest.raises(ValueError, match="custom calls whose targets have no compatibility"):
        jax.export.export(jax.jit(_train_step))(*_args())
