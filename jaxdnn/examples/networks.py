"""ResNet-18/50 and a ConvNeXt-style stage on an `Ops` table (models.py), so that each runs on
jaxdnn's primitives or on the jax.lax / jax.nn ops from one initialisation.

As in models.py, parameters and batch-norm state are plain pytrees of arrays and
`apply(ops, params, state, x, train)` returns (log-probabilities, new state): `loss_fn` and
`Trainer` (train.py) take these models unchanged. Nothing here places data on a device, so a
batch-sharded `x` runs under jit as any other input does.
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp

from .models import Ops, _bn_state, _conv_bn, _conv_params, _dense_params, _he

# Blocks per stage: basic blocks (two 3x3 convs) for ResNet-18, bottlenecks (1x1, 3x3, 1x1
# expanding 4x) for ResNet-50.
RESNET_STAGES = {18: (2, 2, 2, 2), 50: (3, 4, 6, 3)}
BOTTLENECK_EXPANSION = 4


def _keys(key):
    """An endless stream of independent keys."""
    return (jax.random.fold_in(key, i) for i in itertools.count())


def _padding(k: int):
    """k // 2 on each side of a k x k window: SAME at stride 1, and torchvision's padding at
    stride 2 (the layers of tests/problems.py's ResNet-50 table)."""
    return ((k // 2, k // 2),) * 2


# ---- ResNet -----------------------------------------------------------------------------------
# Stem (7x7/2 conv, BN, ReLU, 3x3/2 max pool; or CIFAR's 3x3/1 conv, BN, ReLU), four stages of
# residual blocks (the first block of stages 2-4 halves the resolution; a 1x1 projection with BN
# on the shortcut where the shape changes), global average pool, dense, log-softmax. Stride 2
# sits on a bottleneck's 3x3 conv (ResNet v1.5, as torchvision).

def init_resnet(key, depth: int, num_classes: int, image_shape, cifar_stem: bool = False,
                width: int = 64):
    """(params, state) of a ResNet-`depth` (18 or 50) for `image_shape` (H, W, C) inputs;
    `width`: the channels of the stem and of the first stage (64 in the paper)."""
    if depth not in RESNET_STAGES:
        raise ValueError(f"init_resnet: depth must be one of {sorted(RESNET_STAGES)}, got {depth}")
    keys = _keys(key)
    bottleneck = depth >= 50
    expansion = BOTTLENECK_EXPANSION if bottleneck else 1
    params = {"stem": _conv_params(next(keys), 3 if cifar_stem else 7, image_shape[-1], width),
              "stages": []}
    state = {"stem": _bn_state(width), "stages": []}
    cin = width
    for stage, blocks in enumerate(RESNET_STAGES[depth]):
        mid = width * 2 ** stage
        cout = mid * expansion
        p_blocks, s_blocks = [], []
        for block in range(blocks):
            if bottleneck:
                layers = [("conv1", 1, cin, mid), ("conv2", 3, mid, mid), ("conv3", 1, mid, cout)]
            else:
                layers = [("conv1", 3, cin, mid), ("conv2", 3, mid, cout)]
            if cin != cout or _block_stride(stage, block) != 1:
                layers.append(("proj", 1, cin, cout))
            p_blocks.append({name: _conv_params(next(keys), k, a, b) for name, k, a, b in layers})
            s_blocks.append({name: _bn_state(b) for name, _, _, b in layers})
            cin = cout
        params["stages"].append(p_blocks)
        state["stages"].append(s_blocks)
    params["head"] = _dense_params(next(keys), cin, num_classes)
    return params, state


def _block_stride(stage: int, block: int) -> int:
    return 2 if stage and not block else 1


def _conv_bn_padded(ops: Ops, p, s, x, train, stride=1, **epilogue):
    return _conv_bn(ops, p, s, x, train, stride, _padding(p["w"].shape[0]), **epilogue)


def _residual_block(ops: Ops, p, s, x, train, stride):
    """relu(convs(x) + shortcut(x)) and the block's new BN state; the stride goes to the first
    3x3 conv (conv2 of a bottleneck, conv1 of a basic block). The last batch norm takes the
    shortcut and the ReLU (one fused op on jaxdnn)."""
    names = [n for n in ("conv1", "conv2", "conv3") if n in p]
    strided = "conv2" if "conv3" in p else "conv1"
    new = {}
    shortcut = x
    if "proj" in p:
        shortcut, new["proj"] = _conv_bn_padded(ops, p["proj"], s["proj"], x, train, stride)
    y = x
    for i, name in enumerate(names):
        last = i + 1 == len(names)
        y, new[name] = _conv_bn_padded(ops, p[name], s[name], y, train,
                                       stride if name == strided else 1, activation="relu",
                                       residual=shortcut if last else None)
    return y, new


def apply_resnet(ops: Ops, params, state, x, train: bool):
    """Log-probabilities (N, classes) and the updated batch-norm state. The stem's filter says
    which stem it is: 7x7 (stride 2, then the max pool) or CIFAR's 3x3 (stride 1)."""
    imagenet_stem = params["stem"]["w"].shape[0] == 7
    x, stem = _conv_bn_padded(ops, params["stem"], state["stem"], x, train,
                              2 if imagenet_stem else 1, activation="relu")
    if imagenet_stem:
        x = ops.max_pool(x, 3, 2, "SAME")
    stages = []
    for i, (p_blocks, s_blocks) in enumerate(zip(params["stages"], state["stages"])):
        stages.append([])
        for j, (p, s) in enumerate(zip(p_blocks, s_blocks)):
            x, new = _residual_block(ops, p, s, x, train, _block_stride(i, j))
            stages[-1].append(new)
    logits = ops.dense(ops.global_avg_pool(x), params["head"]["w"], params["head"]["b"])
    return ops.log_softmax(logits), {"stem": stem, "stages": stages}


# ---- ConvNeXt stage ---------------------------------------------------------------------------
# Blocks of: depthwise 7x7 conv, layer norm over channels, 1x1 conv expanding 4x, GELU, 1x1 conv
# back, residual add (ConvNeXt without layer scale or drop path); then a head (global average
# pool, dense, log-softmax) so that there is a loss. The input is the stage's feature map.

CONVNEXT_EXPANSION = 4


def init_convnext_stage(key, num_classes: int, image_shape, blocks: int = 3):
    """(params, state) of `blocks` ConvNeXt blocks on (H, W, C) feature maps; no state."""
    c = image_shape[-1]
    hidden = CONVNEXT_EXPANSION * c
    keys = _keys(key)

    def block():
        return {"dw": {"w": _he(next(keys), (7, 7, 1, c), 49), "b": jnp.zeros((c,))},
                "norm": {"scale": jnp.ones((c,)), "bias": jnp.zeros((c,))},
                "expand": {"w": _he(next(keys), (1, 1, c, hidden), c), "b": jnp.zeros((hidden,))},
                "project": {"w": _he(next(keys), (1, 1, hidden, c), hidden),
                            "b": jnp.zeros((c,))}}

    params = {"blocks": [block() for _ in range(blocks)],
              "head": _dense_params(next(keys), c, num_classes)}
    return params, {}


def apply_convnext_stage(ops: Ops, params, state, x, train: bool):
    """Log-probabilities (N, classes); `state` (empty) comes back as it is."""
    del train  # no batch statistics
    for p in params["blocks"]:  # (each conv takes its bias, GELU or residual as one op)
        y = ops.conv(x, p["dw"]["w"], groups=x.shape[-1], bias=p["dw"]["b"])
        y = ops.layer_norm(y, p["norm"]["scale"], p["norm"]["bias"])
        y = ops.conv(y, p["expand"]["w"], bias=p["expand"]["b"], activation="gelu")
        x = ops.conv(y, p["project"]["w"], bias=p["project"]["b"], residual=x)
    logits = ops.dense(ops.global_avg_pool(x), params["head"]["w"], params["head"]["b"])
    return ops.log_softmax(logits), state
