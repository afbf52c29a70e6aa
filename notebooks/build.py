"""Writes the notebooks from the cell sources below and executes them, so the committed
.ipynb files carry their outputs:  python notebooks/build.py [name ...]

The test suite (tests/test_notebooks.py) executes the committed notebooks again on the CPU,
so they cannot rot.
"""

from __future__ import annotations

import os
import sys

import nbformat
from nbclient import NotebookClient

HERE = os.path.dirname(os.path.abspath(__file__))

NOTEBOOKS = {
    "01_quickstart": [
        ("md", """# jaxdnn quick start

jaxdnn's ops are JAX primitives backed by our own C++ (CPU) and CUDA kernels. This notebook
runs one op, a convolution, under `jit`, `grad`, `vmap` and `check_grads`, and checks it
against `jax.lax`."""),
        ("code", """import jax, jax.numpy as jnp, numpy as np
jax.config.update("jax_enable_x64", True)   # float64 for the gradient check below
import jaxdnn
jaxdnn.build_info()"""),
        ("md", "## An op under `jit`\n`jaxdnn.conv` is channels-last by default (NHWC input, "
               "HWIO filter)."),
        ("code", """kx, kw = jax.random.split(jax.random.key(0))
x = jax.random.normal(kx, (4, 16, 16, 3))
w = jax.random.normal(kw, (3, 3, 3, 8)) * 0.2

conv = jax.jit(lambda x, w: jaxdnn.conv(x, w, stride=2, padding="SAME"))
y = conv(x, w)
ref = jax.lax.conv_general_dilated(x, w, (2, 2), "SAME",
                                   dimension_numbers=("NHWC", "HWIO", "NHWC"))
print(y.shape, "max |jaxdnn - lax| =", float(jnp.max(jnp.abs(y - ref))))"""),
        ("md", "The compiled program calls our kernel; the algorithm is recorded in it:"),
        ("code", """text = conv.lower(x, w).as_text()
print([line.strip()[:110] for line in text.splitlines() if "custom_call" in line][0])"""),
        ("md", "## `grad`: the backward pass runs our backward-data and backward-filter kernels"),
        ("code", """def loss(w, x):
    return jnp.mean(jaxdnn.relu(jaxdnn.conv(x, w, padding=1)) ** 2)

g = jax.grad(loss)(w, x)
g_ref = jax.grad(lambda w, x: jnp.mean(jax.nn.relu(jax.lax.conv_general_dilated(
    x, w, (1, 1), [(1, 1), (1, 1)], dimension_numbers=("NHWC", "HWIO", "NHWC"))) ** 2))(w, x)
print("relative error of the filter gradient:",
      float(jnp.linalg.norm(g - g_ref) / jnp.linalg.norm(g_ref)))
print([e.direction for e in jaxdnn.explain(jax.grad(loss), w, x)])"""),
        ("md", "## `vmap`: a batch of filters folds into the groups of one call (no loop)"),
        ("code", """ws = jax.random.normal(kw, (5, 3, 3, 3, 8))
ys = jax.vmap(lambda w: jaxdnn.conv(x, w, padding=1))(ws)
print(ys.shape)
per_example = jax.vmap(jax.grad(loss), in_axes=(None, 0))(w, x[:, None])
print("per-example gradients:", per_example.shape)"""),
        ("md", "## `check_grads` in float64, forward and reverse mode, second order"),
        ("code", """from jax.test_util import check_grads
x64 = np.random.default_rng(0).standard_normal((2, 7, 7, 3))
w64 = np.random.default_rng(1).standard_normal((3, 3, 3, 4))
check_grads(lambda x, w: jaxdnn.conv(x, w, stride=2, padding=1), (x64, w64), order=2,
            modes=("fwd", "rev"))
print("check_grads passed")"""),
        ("md", "## Other ops\nPooling, activations, softmax and normalization work the same way:"),
        ("code", """h = jaxdnn.max_pool(jaxdnn.relu(y), (2, 2), strides=(2, 2))
p = jaxdnn.softmax(jaxdnn.global_avg_pool(h), axis=-1)
print(h.shape, p.shape, p.sum(axis=-1))"""),
    ],
    "02_train_cnn": [
        ("md", """# Training a small ResNet with jaxdnn

The model (`jaxdnn/examples/models.py`) is written with jaxdnn's ops only — conv, batch norm,
ReLU, max pool, global average pool, log-softmax — with parameters as plain pytrees and one
`jax.jit(jax.value_and_grad(loss))` step (`jaxdnn/examples/train.py`). The data is the 8x8
handwritten-digits set bundled with scikit-learn, so nothing is downloaded."""),
        ("code", """import jax
import jaxdnn
from jaxdnn.examples import train_cnn
print(jax.devices())"""),
        ("code", """result = train_cnn.main(["--epochs", "12", "--plot", "train_cnn.png", "--no-progress"])"""),
        ("md", "The loss and test-accuracy curves:"),
        ("code", """from IPython.display import Image
Image("train_cnn.png")"""),
        ("md", """## The same model on `jax.lax` / `jax.nn`
`--compare-lax` trains both versions from one initialisation on the same batches and
reports the losses after 50 steps and the speed ratio."""),
        ("code", """cmp = train_cnn.main(["--compare-lax", "--compare-steps", "50", "--no-progress"])"""),
    ],
    "03_algorithms": [
        ("md", """# Convolution algorithms and their selection

Like cuDNN, jaxdnn has several algorithms per convolution direction. Each declares whether
it supports a problem (and why not), the workspace it needs, whether it is deterministic and
whether it uses tensor cores. The library picks one per problem when a function is traced:
by a heuristic by default, by measurement in benchmark mode, restricted by the deterministic
mode and the workspace limit. The choice is recorded in the compiled program."""),
        ("code", """import tempfile
import jax, jax.numpy as jnp
import jaxdnn

x = jax.ShapeDtypeStruct((8, 56, 56, 64), jnp.float32)
w = jax.ShapeDtypeStruct((3, 3, 64, 64), jnp.float32)
problem = jaxdnn.conv_problem(x, w, padding="SAME")
problem"""),
        ("md", "## Get: every algorithm, whether it applies, its workspace and rank"),
        ("code", """def show(infos):
    for a in infos:
        print(f"{a.platform:5s} {a.direction:10s} {a.name:14s} supported={a.supported!s:5s} "
              f"rank={a.rank!s:4s} workspace={a.workspace_bytes:>12,d} B "
              f"deterministic={a.deterministic} tensor_cores={a.tensor_cores} {a.reason}")

platforms = ["cpu"] + (["cuda"] if jaxdnn.build_info()["cuda"] else [])
for platform in platforms:
    show(jaxdnn.conv_algorithms(problem, platform))"""),
        ("md", "The explicit im2col matrix replicates every input element once per filter tap "
               "(49 times for 7x7), so a GPU-style im2col + GEMM needs a workspace the size of "
               "that matrix. jaxdnn's CPU `im2col_gemm` builds it in blocks that stay in cache, "
               "so its workspace stays small whatever the filter:"),
        ("code", """for k in (1, 3, 7):
    p = jaxdnn.conv_problem(jax.ShapeDtypeStruct((32, 224, 224, 3), jnp.float32),
                            jax.ShapeDtypeStruct((k, k, 3, 64), jnp.float32), padding="SAME")
    n, _, h, w, c = p.spec.lhs_shape
    full = n * h * w * k * k * c * 4  # the whole im2col matrix, float32 (stride 1, SAME)
    blocked = {a.name: a.workspace_bytes for a in jaxdnn.conv_algorithms(p, "cpu")}
    print(f"{k}x{k}: whole im2col matrix {full / 2**20:8.1f} MiB; "
          f"im2col_gemm workspace {blocked['im2col_gemm'] / 2**20:.2f} MiB, "
          f"direct {blocked['direct']} B")"""),
        ("md", "## Find: run and time every applicable algorithm, checking each result"),
        ("code", """small = jaxdnn.conv_problem(jax.ShapeDtypeStruct((4, 28, 28, 32), jnp.float32),
                           jax.ShapeDtypeStruct((3, 3, 32, 32), jnp.float32), padding="SAME")
for r in jaxdnn.find_conv_algorithms(small, repeats=3):
    print(f"{r.name:14s} {r.time_s * 1e3:8.3f} ms  ok={r.ok}  error={r.error:.1e}")"""),
        ("md", "## Selection: heuristic, benchmark mode, deterministic mode, workspace limit\n"
               "`jaxdnn.explain` lists every convolution of a function — backward directions "
               "included — with the algorithm that will run and why."),
        ("code", """def step(w, x):
    return jax.value_and_grad(lambda w: jnp.mean(jaxdnn.conv(x, w, padding="SAME") ** 2))(w)

xs = jax.ShapeDtypeStruct((4, 28, 28, 32), jnp.float32)
ws = jax.ShapeDtypeStruct((3, 3, 32, 32), jnp.float32)
print(jaxdnn.explain(step, ws, xs))"""),
        ("code", """cache = tempfile.mkdtemp()
with jaxdnn.config(benchmark=True, cache_dir=cache):
    print(jaxdnn.explain(step, ws, xs))      # measures, then caches on disk
with jaxdnn.config(benchmark=True, cache_dir=cache):
    print(jaxdnn.explain(step, ws, xs))      # served from the cache"""),
        ("code", """with jaxdnn.config(workspace_limit=0):
    print(jaxdnn.explain(step, ws, xs))
with jaxdnn.config(deterministic=True):
    print(jaxdnn.explain(step, ws, xs))"""),
        ("md", "Forcing an algorithm that is not registered, or that cannot run the problem, "
               "is an error that names the algorithms that would work:"),
        ("code", """try:
    jaxdnn.explain(lambda x, w: jaxdnn.conv(x, w, algo="winograd"), xs, ws)
except ValueError as e:
    print(e)"""),
    ],
}


def build(name: str, cells) -> str:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nb.cells = [nbformat.v4.new_markdown_cell(src) if kind == "md" else
                nbformat.v4.new_code_cell(src) for kind, src in cells]
    NotebookClient(nb, timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": HERE}}).execute()
    path = os.path.join(HERE, f"{name}.ipynb")
    nbformat.write(nb, path)
    return path


if __name__ == "__main__":
    for name in sys.argv[1:] or NOTEBOOKS:
        print("wrote", build(name, NOTEBOOKS[name]))
