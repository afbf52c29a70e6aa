"""Runs every CUDA kernel of jaxdnn once or a few times on small, awkward shapes, for
compute-sanitizer. (memcheck over the pytest suite, which also runs XLA's own GPU kernels for
the references, segfaulted after 24 tests on the H200; this script runs only jaxdnn's ops.)

    compute-sanitizer --tool memcheck --error-exitcode 1 python3 dev/sanitize.py [families]
    compute-sanitizer --tool racecheck --error-exitcode 1 python3 dev/sanitize.py conv norm

families: activation softmax norm norm_fused pool conv (default: all); conv=NAME,NAME runs
only those problems of the conv grid. Each op runs forward and backward (norm_fused: forward)
(jax.vjp with a random cotangent) in float32 and bfloat16; conv runs every supported CUDA
algorithm in every direction on a reduced grid, and its integer problems (int8 -> int32, direct
alone) in every direction. Results are only checked for finiteness: the
point is the sanitizer's report (the test suite checks the values).
JAXDNN_SANITIZE_DTYPES=bfloat16 keeps one dtype; JAXDNN_SANITIZE_ALGOS=NAME,NAME keeps those
conv algorithms (racecheck is slow: aim it at the changed kernels); JAXDNN_SANITIZE_PLATFORM=cpu
runs the same calls on the CPU (a dry run of the script itself).
"""

from __future__ import annotations

import dataclasses
import os
import sys
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

import jaxdnn
from jaxdnn.ops import conv as conv_ops
from jaxdnn.ops.norm import NormShape
from jaxdnn.selection import conv as conv_sel
from jaxdnn.selection.norm import NormProblem

PLATFORM = os.environ.get("JAXDNN_SANITIZE_PLATFORM", "gpu")  # "cpu": a quick local dry run
GPU = jax.devices(PLATFORM)[0]
RNG = np.random.default_rng(0)
DTYPES = tuple(getattr(jnp, d) for d in
               os.environ.get("JAXDNN_SANITIZE_DTYPES", "float32,bfloat16").split(","))
ALGOS = [a for a in os.environ.get("JAXDNN_SANITIZE_ALGOS", "").split(",") if a]


def rand(shape, dtype):
    return jax.device_put(jnp.asarray(RNG.standard_normal(shape), dtype), GPU)


def finite(name, *results):
    """Raises unless every leaf of results is finite; counts one case."""
    for leaf in jax.tree.leaves(results):
        if not bool(jnp.all(jnp.isfinite(leaf.astype(jnp.float32)))):
            raise AssertionError(f"{name}: non-finite result")
    print(f"ok {name}", flush=True)


def fwd_bwd(name, fn, *args):
    """fn(*args) and its vjp with a random cotangent."""
    out, vjp = jax.vjp(fn, *args)
    finite(name, out, vjp(jax.tree.map(lambda o: rand(o.shape, o.dtype), out)))


def activation():
    fns = {"relu": jaxdnn.relu, "relu6": jaxdnn.relu6, "leaky_relu": jaxdnn.leaky_relu,
           "elu": jaxdnn.elu, "sigmoid": jaxdnn.sigmoid, "tanh": jaxdnn.tanh,
           "gelu": jaxdnn.gelu, "gelu_exact": lambda x: jaxdnn.gelu(x, approximate=False),
           "silu": jaxdnn.silu, "softplus": jaxdnn.softplus}
    for dt in DTYPES:
        for shape in ((7, 13), (1, 4099), (3,)):
            x = rand(shape, dt)
            for n, f in fns.items():
                fwd_bwd(f"{n} {shape} {dt.__name__}", f, x)


def softmax():
    for dt in DTYPES:
        for shape, axis in (((5, 37), -1), ((3, 9000), -1), ((6, 7, 5), 1), ((33, 4), 0)):
            x = rand(shape, dt)
            fwd_bwd(f"softmax {shape} {axis} {dt.__name__}", lambda x: jaxdnn.softmax(x, axis), x)
            fwd_bwd(f"log_softmax {shape} {axis} {dt.__name__}",
                    lambda x: jaxdnn.log_softmax(x, axis), x)


def norm():
    for dt in DTYPES:
        for shape, axis in (((3, 5, 7, 12), -1), ((3, 12, 5, 7), 1), ((200, 20), -1),
                            ((2, 12, 24, 32), 1)):
            x, c = rand(shape, dt), shape[axis]
            s, b = rand((c,), dt), rand((c,), dt)
            m, v = rand((c,), jnp.float32), jnp.abs(rand((c,), jnp.float32)) + 0.5
            fwd_bwd(f"batch_norm {shape} {axis} {dt.__name__}",
                    lambda x, s, b: jaxdnn.batch_norm(x, s, b, axis=axis), x, s, b)
            fwd_bwd(f"batch_norm_inference {shape} {axis} {dt.__name__}",
                    lambda x, s, b: jaxdnn.batch_norm_inference(x, s, b, m, v, axis=axis),
                    x, s, b)
            fwd_bwd(f"group_norm {shape} {dt.__name__}",
                    lambda x, s, b: jaxdnn.group_norm(
                        x, s, b, groups=4, layout="NCHW" if axis == 1 else None), x, s, b)
            if axis == -1:  # the fused epilogue: + residual, ReLU, and the masked backward
                fwd_bwd(f"batch_norm+add+relu {shape} {dt.__name__}",
                        lambda x, s, b, r: jaxdnn.batch_norm(x, s, b, activation="relu",
                                                             residual=r), x, s, b, rand(shape, dt))
                fwd_bwd(f"batch_norm_inference+add+relu {shape} {dt.__name__}",
                        lambda x, s, b, r: jaxdnn.batch_norm_inference(
                            x, s, b, m, v, activation="relu", residual=r), x, s, b,
                        rand(shape, dt))
        # (2000, 4096): the row backward's 256-thread blocks, each walking more rows than its ring
        # has stages; (300, 16384): 512 threads x 32 values in 16-bit types, the streaming
        # backward (sums in shared memory in float32, in the workspace in float64).
        for shape in ((7, 13), (3, 5000), (2, 3, 64), (2000, 4096), (300, 16384)):
            x = rand(shape, dt)
            s, b = rand(shape[-1:], dt), rand(shape[-1:], dt)
            fwd_bwd(f"layer_norm {shape} {dt.__name__}", jaxdnn.layer_norm, x, s, b)
            fwd_bwd(f"rms_norm {shape} {dt.__name__}", jaxdnn.rms_norm, x, s)


def norm_fused():
    """The training forwards on tensors larger than the blocks' shared memory holds at once (~26
    MB on an H200), in bfloat16 too: the single-pass kernels (channels-last, and channels-first
    16x16 images), every block both keeping rows on chip and streaming the rest back through
    phase 3's ring of stash slots, and the split forward (channels-first 96x96 images, several
    pieces per segment), with every training forward algorithm that runs the problem (forced:
    single pass, split, three passes, two calls), channels-last also with the fused epilogue
    (+ residual, ReLU); forward only."""
    cases = (("batch_norm NHWC", (32, 96, 96, 64),
              lambda x, s, b, **kw: jaxdnn.batch_norm(x, s, b, **kw)),
             ("batch_norm+add+relu NHWC", (32, 96, 96, 64),
              lambda x, s, b, **kw: jaxdnn.batch_norm(x, s, b, activation="relu", residual=x,
                                                      **kw)),
             ("batch_norm NCHW", (16, 256, 96, 96),
              lambda x, s, b, **kw: jaxdnn.batch_norm(x, s, b, axis=1, **kw)),
             ("group_norm NHWC", (16, 96, 96, 256),
              lambda x, s, b, **kw: jaxdnn.group_norm(x, s, b, groups=32, **kw)),
             ("group_norm NCHW", (16, 256, 96, 96),
              lambda x, s, b, **kw: jaxdnn.group_norm(x, s, b, groups=32, layout="NCHW",
                                                     **kw)),
             ("batch_norm NCHW", (128, 256, 16, 16),
              lambda x, s, b, **kw: jaxdnn.batch_norm(x, s, b, axis=1, **kw)))
    listing = NormProblem("fwd", NormShape(1, 1, 1, 1, 1), np.dtype(np.float32))
    fwd_algorithms = [a.name for a in jaxdnn.norm_algorithms(listing, PLATFORM)]
    for dt in DTYPES:
        for name, shape, fn in cases:
            c = shape[1] if "NCHW" in name else shape[-1]
            x, s, b = rand(shape, dt), rand((c,), dt), rand((c,), dt)
            for algo in fwd_algorithms:
                try:
                    out = jax.jit(lambda *a, fn=fn: fn(*a, algo=algo))(x, s, b)
                except ValueError as e:  # the algorithm cannot run this problem
                    if f"'{algo}' cannot run" not in str(e):
                        raise
                    continue
                finite(f"{name} {shape} {dt.__name__} (training forward, {algo})", out)


def pool():
    for dt in DTYPES:
        x = rand((2, 11, 9, 5), dt)
        for v, win, st, pad in ((x, (3, 3), (2, 2), "SAME"), (x, (2, 2), (2, 2), "VALID"),
                                (x, (3, 2), (1, 2), ((1, 1), (0, 1))),
                                (rand((2, 11, 9, 16), dt), (2, 2), (2, 2), "VALID")):  # tiles
            c = v.shape[-1]
            fwd_bwd(f"max_pool {win} {st} {pad} C={c} {dt.__name__}",
                    lambda x: jaxdnn.max_pool(x, win, st, pad), v)
            fwd_bwd(f"avg_pool {win} {st} {pad} C={c} {dt.__name__}",
                    lambda x: jaxdnn.avg_pool(x, win, st, pad, count_include_pad=False), v)
        fwd_bwd(f"avg_pool 3-D {dt.__name__}",
                lambda x: jaxdnn.avg_pool(x, (2, 2, 2), (1, 1, 1), "SAME"),
                rand((2, 5, 6, 7, 3), dt))
        fwd_bwd(f"global_avg_pool {dt.__name__}", jaxdnn.global_avg_pool, x)
        fwd_bwd(f"max_pool NCHW {dt.__name__}",
                lambda x: jaxdnn.max_pool(x, (3, 3), (2, 2), "SAME", layout="NCHW"),
                rand((2, 5, 11, 9), dt))


NHWC = ("NHWC", "HWIO", "NHWC")
CONV_GRID = [  # (name, x shape, w shape, conv_general_dilated keywords)
    ("3x3_same", (2, 9, 11, 16), (3, 3, 16, 24), dict(window_strides=(1, 1), padding="SAME")),
    ("3x3_stride2", (3, 13, 10, 8), (3, 3, 8, 16),
     dict(window_strides=(2, 2), padding=((1, 2), (0, 1)))),
    ("1x1_wide", (2, 7, 9, 32), (1, 1, 32, 136), dict(window_strides=(1, 1), padding="VALID")),
    ("split_k", (4, 30, 30, 64), (3, 3, 64, 64), dict(window_strides=(1, 1), padding="SAME")),
    ("halo_two_chunks", (2, 28, 21, 128), (3, 3, 128, 128),
     dict(window_strides=(1, 1), padding=((2, 0), (0, 2)))),
    ("wide_256", (2, 9, 7, 256), (3, 3, 256, 256),
     dict(window_strides=(1, 1), padding=((1, 0), (0, 2)))),
    ("stem", (2, 17, 17, 3), (7, 7, 3, 64), dict(window_strides=(2, 2),
                                                 padding=((3, 3), (3, 3)))),
    ("depthwise", (2, 12, 13, 24), (3, 3, 1, 24),
     dict(window_strides=(1, 1), padding="SAME", feature_group_count=24)),
    ("depthwise7", (2, 12, 13, 16), (7, 7, 1, 16),
     dict(window_strides=(1, 1), padding="SAME", feature_group_count=16)),
]


def conv(names=""):
    grid = [c for c in CONV_GRID if not names or c[0] in names.split(",")]
    for dt in DTYPES:
        for precision in ("highest", "default") if dt == jnp.float32 else ("highest",):
            for name, xs, ws, kw in grid:
                def f(x, w, kw=kw):
                    y, vjp = jax.vjp(lambda x, w: jaxdnn.conv_general_dilated(
                        x, w, precision=precision, dimension_numbers=NHWC, **kw), x, w)
                    return vjp(y)
                sds = [jax.ShapeDtypeStruct(s, dt) for s in (xs, ws)]
                for p in jaxdnn.conv_problems(f, *sds):
                    a_shape, b_shape, _ = conv_ops._shapes(p.direction, p.spec)
                    a, b = rand(a_shape, dt), rand(b_shape, dt)
                    for info in jaxdnn.conv_algorithms(p, "cuda" if PLATFORM == "gpu" else "cpu"):
                        if not info.supported or (ALGOS and info.base not in ALGOS):
                            continue
                        run = conv_sel._run_algorithm(info.name, p.direction, p.spec, p.out_dtype)
                        finite(f"conv {name} {p.direction} {info.name} {dt.__name__} "
                               f"{precision}", run(a, b))
    # The fused epilogue, forward and backward: every activation under the chosen algorithm,
    # and every forward algorithm (the wgmma GEMMs apply it in their stores, the rest in the
    # pass) with GELU (the call keeps c beside y) and with none (y in place).
    for dt in DTYPES:
        x, w = rand((2, 9, 7, 16), dt), rand((3, 3, 16, 24), dt)
        b, r = rand((24,), jnp.float32), rand((2, 9, 7, 24), dt)

        def fused(x, w, b, r, act, algo=None):
            return jaxdnn.conv(x, w, padding="SAME", bias=b, activation=act, residual=r,
                               algo=algo)

        for act in conv_ops.EPILOGUE_ACTIVATIONS:
            fwd_bwd(f"conv fused {act} {dt.__name__}", partial(fused, act=act), x, w, b, r)
        (p,) = jaxdnn.conv_problems(partial(fused, act=None), x, w, b, r)
        for info in jaxdnn.conv_algorithms(p, "cuda" if PLATFORM == "gpu" else "cpu"):
            if not info.supported or (ALGOS and info.base not in ALGOS):
                continue
            for act in ("gelu", None):
                fwd_bwd(f"conv fused {act} {info.name} {dt.__name__}",
                        partial(fused, act=act, algo={"fwd": info.name}), x, w, b, r)
    for name, xs, ws, kw in grid:  # integer convolutions (int8 -> int32) in every direction
        sds = [jax.ShapeDtypeStruct(s, jnp.int8) for s in (xs, ws)]
        (fwd,) = jaxdnn.conv_problems(lambda x, w, kw=kw: jaxdnn.conv_general_dilated(
            x, w, dimension_numbers=NHWC, preferred_element_type=jnp.int32, **kw), *sds)
        for direction in conv_ops.DIRECTIONS:
            p = dataclasses.replace(fwd, direction=direction)
            a, b = (jax.device_put(RNG.integers(-128, 128, s, dtype=np.int8), GPU)
                    for s in conv_ops._shapes(direction, p.spec)[:2])
            for info in jaxdnn.conv_algorithms(p, "cuda" if PLATFORM == "gpu" else "cpu"):
                if not info.supported or (ALGOS and info.base not in ALGOS):
                    continue
                run = conv_sel._run_algorithm(info.name, direction, p.spec, p.out_dtype)
                finite(f"conv {name} {direction} {info.name} int8->int32", run(a, b))


FAMILIES = {"activation": activation, "softmax": softmax, "norm": norm,
            "norm_fused": norm_fused, "pool": pool, "conv": conv}

if __name__ == "__main__":
    for fam in sys.argv[1:] or list(FAMILIES):
        fam, _, names = fam.partition("=")
        FAMILIES[fam](*[names] if names else [])
    print("all done")
