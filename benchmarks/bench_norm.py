"""Normalisation benchmark: jaxdnn vs the XLA path (flax-style jnp, jitted), side by side.

    python benchmarks/bench_norm.py                 # default backend (GPU shapes on a GPU)
    python benchmarks/bench_norm.py --platform cpu  # CPU shapes
    python benchmarks/bench_norm.py --ops layer_norm,batch_norm --dtypes bfloat16
    python benchmarks/bench_norm.py --ops layer_norm,rms_norm --rows 8192x16384  # other rows

Two directions (benchmarks/common.py DIRECTIONS_NOTE): fwd, and fwd+bwd as a training step runs
it, jit(value_and_grad(lambda x, s, b: sum(norm(x, s, b) * ct), argnums=(0, 1, 2))) on both
sides, so that XLA may recompute what the flax-style reference would otherwise save (three
float32 tensors for the backward, even for bfloat16 inputs). Reports GB/s of minimal traffic
(fwd: read x + write y; fwd+bwd: read x and ct + write dx; parameters and statistics are
negligible) and the time ratio XLA / jaxdnn (> 1: jaxdnn is faster). The references follow
flax's defaults (statistics in float32 for 16-bit inputs, variance as E[x^2] - E[x]^2); each row
also reports jaxdnn's relative L2 error, as a sanity check.
"""

from __future__ import annotations

import argparse
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import jaxdnn
from common import (BANDWIDTH_COLUMNS, DIRECTIONS_NOTE, FWD, FWD_BWD, add_row_args, compare,
                    default_trials, fwd_bwd, geomeans_note, keep_freed_host_memory,
                    rotating_inputs, rotation_for, run_cases, timing_note, write_results)

EPS = 1e-5


def _stats(x, axes, fast=True):
    """flax-style statistics in float32 (float64 for float64): mean and variance."""
    xf = x.astype(jnp.promote_types(x.dtype, jnp.float32))
    mean = xf.mean(axes, keepdims=True)
    if fast:
        var = jnp.maximum(0.0, jnp.square(xf).mean(axes, keepdims=True) - jnp.square(mean))
    else:
        var = jnp.square(xf - mean).mean(axes, keepdims=True)
    return xf, mean, var


# ---- references (XLA path) and jaxdnn, per op: f(x, scale, bias) -> y (or y, mean, var) -------

def ref_layer_norm(x, s, b, fast=True):
    xf, m, v = _stats(x, -1, fast)
    return ((xf - m) * lax.rsqrt(v + EPS) * s + b).astype(x.dtype)


def ref_rms_norm(x, s, b, fast=True):
    xf = x.astype(jnp.promote_types(x.dtype, jnp.float32))
    return (xf * lax.rsqrt(jnp.square(xf).mean(-1, keepdims=True) + EPS) * s).astype(x.dtype)


def _bn_axes(x, axis):
    return tuple(a for a in range(x.ndim) if a != axis % x.ndim)


def _expand(p, x, axis):
    shape = [1] * x.ndim
    shape[axis] = -1
    return p.reshape(shape)


def ref_batch_norm(axis):
    def f(x, s, b, fast=True):
        xf, m, v = _stats(x, _bn_axes(x, axis), fast)
        y = (xf - m) * lax.rsqrt(v + EPS) * _expand(s, x, axis) + _expand(b, x, axis)
        return y.astype(x.dtype), m.reshape(-1), v.reshape(-1)
    return f


def ref_batch_norm_inference(axis):
    def f(x, s, b, m, v, fast=True):
        del fast
        xf = x.astype(jnp.promote_types(x.dtype, jnp.float32))
        y = ((xf - _expand(m, x, axis)) * lax.rsqrt(_expand(v, x, axis) + EPS)
             * _expand(s, x, axis) + _expand(b, x, axis))
        return y.astype(x.dtype)
    return f


def ref_group_norm(groups, channels_first):
    def f(x, s, b, fast=True):
        n, c = x.shape[0], (x.shape[1] if channels_first else x.shape[-1])
        if channels_first:
            xg = x.reshape(n, groups, -1)
            axes = (2,)
        else:
            xg = x.reshape(n, -1, groups, c // groups)
            axes = (1, 3)
        xf, m, v = _stats(xg, axes, fast)
        y = ((xf - m) * lax.rsqrt(v + EPS)).reshape(x.shape)
        shape = [1] * x.ndim
        shape[1 if channels_first else -1] = c
        return (y * s.reshape(shape) + b.reshape(shape)).astype(x.dtype)
    return f


def cases(platform: str, rows=None):
    """(name, layout, shape, jaxdnn fn, reference fn, n_stats_inputs); `rows`: the layer and
    RMS norm shape (default 32768x4096 on a GPU, 4096x1024 on the CPU)."""
    gpu = platform != "cpu"
    rows = rows or ((32768, 4096) if gpu else (4096, 1024))
    bn = (64, 112, 112, 64) if gpu else (8, 56, 56, 64)
    gn = (32, 56, 56, 256) if gpu else (8, 28, 28, 128)
    nchw = lambda s: (s[0], s[3], s[1], s[2])
    return [
        ("layer_norm", "rows", rows, lambda x, s, b: jaxdnn.layer_norm(x, s, b), ref_layer_norm, 0),
        ("rms_norm", "rows", rows, lambda x, s, b: jaxdnn.rms_norm(x, s), ref_rms_norm, 0),
        ("batch_norm", "NHWC", bn, lambda x, s, b: jaxdnn.batch_norm(x, s, b),
         ref_batch_norm(-1), 0),
        ("batch_norm", "NCHW", nchw(bn), lambda x, s, b: jaxdnn.batch_norm(x, s, b, axis=1),
         ref_batch_norm(1), 0),
        ("batch_norm_inference", "NHWC", bn,
         lambda x, s, b, m, v: jaxdnn.batch_norm_inference(x, s, b, m, v),
         ref_batch_norm_inference(-1), 2),
        ("group_norm", "NHWC", gn, lambda x, s, b: jaxdnn.group_norm(x, s, b, groups=32),
         ref_group_norm(32, False), 0),
        ("group_norm", "NCHW", nchw(gn),
         lambda x, s, b: jaxdnn.group_norm(x, s, b, groups=32, layout="NCHW"),
         ref_group_norm(32, True), 0),
    ]


def _param_shape(name, layout, shape):
    if name in ("layer_norm", "rms_norm"):
        return (shape[-1],)
    return (shape[1] if layout == "NCHW" else shape[-1],)


def _rel_l2(a, b):
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def make_inputs(shape, pshape, n_stats, dtype, normal):
    """(x, scale, bias[, mean, var], ct) of one case, random; normal(shape, dtype) draws standard
    normal values (benchmarks/common.py rotating_inputs)."""
    x = (normal(shape) * 2 + 0.5).astype(dtype)
    params = [normal(pshape) for _ in range(2)]
    if n_stats:
        params += [normal(pshape), jnp.abs(normal(pshape)) + 0.5]
    return (x, *params, normal(shape, dtype))


def bench_case(case, dtype, directions, device, trials, repeats):
    name, layout, shape, ours, ref, n_stats = case
    pshape = _param_shape(name, layout, shape)
    nbytes = math.prod(shape) * jnp.dtype(dtype).itemsize
    inputs = rotating_inputs(lambda normal: make_inputs(shape, pshape, n_stats, dtype, normal),
                             rotation_for(3 * nbytes), device=device)
    first = lambda out: out[0] if isinstance(out, tuple) else out

    def row(direction, f_ours, f_ref, args, traffic, err):
        return compare(name, dtype, direction, shape, f_ours, f_ref, args, traffic * nbytes,
                       trials, repeats, layout=layout) | {"err": err}

    rows = []
    if FWD in directions:
        args = [a[:-1] for a in inputs]
        exact = jax.jit(lambda *a: first(ref(*a, fast=False)))(*args[0])
        err = _rel_l2(jax.jit(lambda *a: first(ours(*a)))(*args[0]), exact)
        rows.append(row(FWD, ours, ref, args, 2, err))
    if FWD_BWD in directions:
        steps = [fwd_bwd(f, argnums=(0, 1, 2)) for f in (ours, ref)]
        dx_ours, dx_ref = (jax.jit(s)(*inputs[0])[1][0] for s in steps)
        rows.append(row(FWD_BWD, *steps, inputs, 3, _rel_l2(dx_ours, dx_ref)))
    return rows


def _row_shape(text: str) -> tuple[int, int]:
    try:
        r, k = (int(v) for v in text.split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--rows wants ROWSxK, e.g. 8192x16384, not {text!r}")
    if r < 1 or k < 1:
        raise argparse.ArgumentTypeError(f"--rows wants positive sizes, not {text!r}")
    return r, k


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--platform", default=None, help="cpu or gpu (default: jax's default)")
    parser.add_argument("--ops", default=None, help="comma-separated op names")
    parser.add_argument("--directions", default=f"{FWD},{FWD_BWD}")
    parser.add_argument("--rows", default=None, type=_row_shape,
                        help="layer/rms norm shape RxK; its table is saved as norm_rows<K>")
    add_row_args(parser)
    args = parser.parse_args()
    keep_freed_host_memory()
    platform = args.platform or jax.default_backend()
    device = jax.devices(platform)[0]
    ops = set(args.ops.split(",")) if args.ops else None
    directions = set(args.directions.split(","))
    trials = default_trials(args.trials, platform)
    rows = run_cases([c for c in cases(platform, args.rows) if not ops or c[0] in ops],
                     args.dtypes, device,
                     lambda case, dt: bench_case(case, dt, directions, device, trials,
                                                 args.repeats))
    notes = (f"{DIRECTIONS_NOTE} Parameters with a gradient: x, scale and bias (also for "
             "batch_norm_inference: a frozen-statistics fine-tune). No backward-only rows: the "
             "two sides' vjps keep different tensors (the flax-style reference saves float32 "
             "intermediates). GB/s of minimal traffic: fwd 2*bytes(x) (read x, write y), "
             "fwd+bwd 3*bytes(x) (read x and ct, write dx); parameters and statistics "
             f"neglected. ratio = XLA time / jaxdnn time. {geomeans_note(rows)} err: jaxdnn's "
             "relative L2 error against a float32 two-pass reference (fwd) or the XLA path's dx "
             f"(fwd+bwd). {timing_note(trials, args.repeats)} {args.note}").strip()
    name = f"norm_rows{args.rows[1]}" if args.rows else "norm"
    write_results(name, rows, ["op", "layout"] + BANDWIDTH_COLUMNS[1:] + ["err"], notes=notes,
                  out_dir=args.out_dir)


if __name__ == "__main__":
    main()
