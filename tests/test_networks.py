"""jaxdnn/examples/networks.py: ResNet-18/50 and the ConvNeXt stage compute the same function on
jaxdnn's ops as on the jax.lax / jax.nn ops (loss, every gradient, the new batch-norm state), a
training step on jaxdnn's ops runs, and the ResNets are torchvision's (parameter counts)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdnn.examples import networks
from jaxdnn.examples.models import cast_floats, jaxdnn_ops, lax_ops, loss_fn
from jaxdnn.examples.optim import sgd
from jaxdnn.examples.train import Trainer
from util import PLATFORMS, assert_close, device

BATCH = 2
# name -> (init(key), apply, input shape): small, so that the file runs in seconds. ResNet-50
# runs at 64x64 (its last stage on 2x2 maps): at 32x32 that stage normalises over the batch's 2
# pixels, which amplifies rounding so much that even float64 gradients differ by 1e-3.
NETS = {
    "resnet18_cifar": (lambda key: networks.init_resnet(key, 18, 10, (16, 16, 3),
                                                        cifar_stem=True, width=8),
                       networks.apply_resnet, (16, 16, 3)),
    "resnet50": (lambda key: networks.init_resnet(key, 50, 10, (64, 64, 3), width=8),
                 networks.apply_resnet, (64, 64, 3)),
    "convnext": (lambda key: networks.init_convnext_stage(key, 10, (8, 8, 16), blocks=2),
                 networks.apply_convnext_stage, (8, 8, 16)),
}
# The comparisons run in float64, where the two sides differ only by rounding: a float32 ReLU
# input within rounding of zero takes either sign, and the gradients below it then differ by
# ~1e-2 (seen in ResNet-50 at 32x32). Rounding still grows through the depth and the batch
# norms over few pixels: ResNet-50's float64 gradients agree to 1e-10 (relative L2) and 7e-10
# of their RMS elementwise; the bounds are ~10x that, while a wrong op is off by > 1e-3.
F64_GROWTH, F64_REL_L2 = 1e6, 1e-8
# The float32 loss of a step against the float64 reference: 2.5e-5 apart for ResNet-50.
F32_GROWTH, F32_REL_L2 = 100, 3e-4


def _inputs(net: str):
    init, apply, shape = NETS[net]
    params, state = init(jax.random.key(0))
    x = jax.random.normal(jax.random.key(1), (BATCH, *shape))
    y = jnp.arange(BATCH) % 10
    return apply, params, state, x, y


@functools.cache
def _value_and_grad(net: str, ops_name: str, platform: str):
    """(loss, new BN state, gradients) in float64, as numpy, on `platform`."""
    apply, params, state, x, y = _inputs(net)
    ops = {"jaxdnn": jaxdnn_ops, "jaxdnn (unfused)": lambda: jaxdnn_ops(fused=False),
           "lax": lax_ops}[ops_name]()
    with jax.default_device(device(platform)):
        (loss, new_state), grads = jax.jit(jax.value_and_grad(
            functools.partial(loss_fn, apply, ops, jnp.float64), has_aux=True))(
                params, state, x, y)
    return jax.tree.map(np.asarray, (loss, new_state, grads))


def _assert_trees_close(out, ref, dtype, what, **bounds):
    leaves, treedef = jax.tree_util.tree_flatten_with_path(ref)
    assert jax.tree.structure(out) == treedef, what
    for (path, r), o in zip(leaves, jax.tree.leaves(out)):
        assert_close(o, r, dtype, what=f"{what}{jax.tree_util.keystr(path)}", **bounds)


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("side", ["jaxdnn", "jaxdnn (unfused)"])
@pytest.mark.parametrize("net", NETS)
def test_jaxdnn_and_lax_networks_agree(net, side, platform):
    """The fused networks, and the unfused baseline bench_e2e --unfused times, are the lax
    networks."""
    ref = _value_and_grad(net, "lax", platform)
    out = _value_and_grad(net, side, platform)
    for part, o, r in zip(("loss", "state", "grad"), out, ref):
        _assert_trees_close(o, r, jnp.float64, f"{net} {part}", tol=F64_REL_L2,
                            growth=F64_GROWTH)


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("net", NETS)
def test_train_step(net, platform):
    """One float32 SGD step on jaxdnn's ops: the loss and the new batch-norm state are the
    float64 reference's, and every parameter moves."""
    apply, params, state, x, y = _inputs(net)
    ref_loss, ref_state, _ = _value_and_grad(net, "lax", platform)
    opt = sgd(0.1)
    trainer = Trainer(apply, jaxdnn_ops(), jnp.float32, opt)
    with jax.default_device(device(platform)):
        new_params, new_state, _, loss = trainer.step(*jax.tree.map(jnp.array, (params, state)),
                                                      opt.init(params), x, y)
    _assert_trees_close((loss, new_state), (ref_loss, ref_state), jnp.float32, net,
                        tol=F32_REL_L2, growth=F32_GROWTH)
    moved = jax.tree.map(lambda a, b: bool(np.any(np.asarray(a) != np.asarray(b))), new_params,
                         params)
    assert all(jax.tree.leaves(moved)), moved


@pytest.mark.parametrize("depth, classes, shape, cifar, count", [
    (50, 1000, (224, 224, 3), False, 25_557_032),   # torchvision.models.resnet50
    (18, 1000, (224, 224, 3), False, 11_689_512),   # torchvision.models.resnet18
    (18, 10, (32, 32, 3), True, 11_173_962),        # the usual CIFAR ResNet-18
])
def test_resnet_is_torchvisions(depth, classes, shape, cifar, count):
    """Parameter counts (weights, batch-norm scale and bias, dense) and the output shape, from
    shapes alone (jax.eval_shape: nothing is computed)."""
    params, state = jax.eval_shape(
        lambda key: networks.init_resnet(key, depth, classes, shape, cifar_stem=cifar),
        jax.random.key(0))
    assert sum(int(np.prod(a.shape)) for a in jax.tree.leaves(params)) == count
    x = jax.ShapeDtypeStruct((BATCH, *shape), jnp.float32)
    logp, new_state = jax.eval_shape(
        lambda p, s, x: networks.apply_resnet(lax_ops(), cast_floats(p, jnp.float32), s, x, True),
        params, state, x)
    assert logp.shape == (BATCH, classes)
    assert jax.tree.structure(new_state) == jax.tree.structure(state)


def test_resnet_depths():
    with pytest.raises(ValueError, match="depth must be one of"):
        networks.init_resnet(jax.random.key(0), 34, 10, (32, 32, 3))
