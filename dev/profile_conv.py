"""Runs one jaxdnn conv direction a few times, for profiling under ncu / nsys:
    ncu --kernel-name regex:gemm_kernel --launch-skip 2 --launch-count 1 \
        python3 dev/profile_conv.py --hw 28 --cin 128 --cout 128 --k 3 --dir fwd --algo implicit_gemm
"""
import argparse

import jax
import jax.numpy as jnp

import jaxdnn

ap = argparse.ArgumentParser()
ap.add_argument("--n", type=int, default=64)
ap.add_argument("--hw", type=int, default=28)
ap.add_argument("--cin", type=int, default=128)
ap.add_argument("--cout", type=int, default=128)
ap.add_argument("--k", type=int, default=3)
ap.add_argument("--stride", type=int, default=1)
ap.add_argument("--groups", type=int, default=1)
ap.add_argument("--dir", default="fwd")
ap.add_argument("--algo", default=None)
ap.add_argument("--dtype", default="bfloat16")
a = ap.parse_args()
pad = a.k // 2
x = jnp.ones((a.n, a.hw, a.hw, a.cin), a.dtype)
w = jnp.ones((a.k, a.k, a.cin // a.groups, a.cout), a.dtype)
conv = lambda x, w: jaxdnn.conv(x, w, stride=a.stride, padding=pad, groups=a.groups,
                                algo={a.dir: a.algo})
y = conv(x, w)
if a.dir == "fwd":
    f = jax.jit(conv)
elif a.dir == "bwd_data":
    f = jax.jit(lambda x, w: jax.vjp(lambda x_: conv(x_, w), x)[1](y)[0])
else:
    f = jax.jit(lambda x, w: jax.vjp(lambda w_: conv(x, w_), w)[1](y)[0])
for _ in range(4):
    jax.block_until_ready(f(x, w))
