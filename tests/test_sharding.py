"""jaxdnn ops under multi-device transformations (CPU devices forced by XLA_FLAGS, so this runs
everywhere): inside shard_map each device runs the kernels on its shard; under jit with
NamedSharding inputs the results match the single-device ones. (How the calls partition under
plain jit is tested in tests/test_partition.py.)"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap


def test_shard_map_and_named_sharding(tmp_path):
    script = textwrap.dedent("""
        import jax, jax.numpy as jnp, numpy as np
        from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
        import jaxdnn
        try:
            from jax import shard_map
        except ImportError:
            from jax.experimental.shard_map import shard_map

        assert len(jax.devices()) == 4
        mesh = Mesh(np.array(jax.devices()), ("batch",))
        rng = np.random.default_rng(0)
        x = jnp.asarray(rng.standard_normal((8, 6, 6, 4)), jnp.float32)
        w = jnp.asarray(rng.standard_normal((3, 3, 4, 8)), jnp.float32)

        def net(x, w):
            y = jaxdnn.relu(jaxdnn.conv(x, w, padding="SAME"))
            y = jaxdnn.max_pool(y, (2, 2), strides=(2, 2))
            return jaxdnn.log_softmax(y.reshape(y.shape[0], -1))

        def loss(w, x):
            return jnp.sum(net(x, w) * jnp.arange(72.0))

        def close(a, b, tol):  # relative L2: the shards sum the filter gradient in another order
            a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
            assert np.linalg.norm(a - b) <= tol * np.linalg.norm(b), np.linalg.norm(a - b)

        ref_y, ref_g = net(x, w), jax.grad(loss)(w, x)
        smap = shard_map(lambda x, w: net(x, w), mesh=mesh, in_specs=(P("batch"), P()),
                         out_specs=P("batch"))
        close(jax.jit(smap)(x, w), ref_y, 1e-6)
        gmap = shard_map(lambda w, x: jax.lax.psum(jax.grad(loss)(w, x), "batch"), mesh=mesh,
                         in_specs=(P(), P("batch")), out_specs=P())
        close(jax.jit(gmap)(w, x), ref_g, 1e-6)

        xs = jax.device_put(x, NamedSharding(mesh, P("batch")))
        close(jax.jit(net)(xs, w), ref_y, 1e-6)
        close(jax.jit(jax.grad(loss))(w, xs), ref_g, 1e-6)
        print("sharding ok")
    """)
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS=os.environ.get("XLA_FLAGS", "") +
               " --xla_force_host_platform_device_count=4")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         env=env, cwd=tmp_path, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "sharding ok" in out.stdout
