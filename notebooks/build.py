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
        ("md", "## Get: every algorithm, whether it applies, its workspace and rank\n"
               "A name is an algorithm and, after dots, the options of its kernel variant "
               "(`im2col_gemm.avx512`: the CPU GEMM's instruction set; on the GPU e.g. "
               "`implicit_precomp_gemm.wgmma.im2col_tma.tma_b.128x128.ws`). Each algorithm's "
               "default variant is listed first, then every other that can run; `algo=` takes "
               "the base name or a variant."),
        ("code", """def show(infos):
    for a in infos:
        print(f"{a.platform:5s} {a.direction:10s} {a.name:22s} supported={a.supported!s:5s} "
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
    blocked = {a.base: a.workspace_bytes for a in jaxdnn.conv_algorithms(p, "cpu") if a.default}
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
    "04_flax_equinox": [
        ("md", """# Flax and equinox models on jaxdnn

`jaxdnn.flax` (linen), `jaxdnn.flax.nnx` and `jaxdnn.equinox` hold modules that subclass the
stock ones of the same name: same constructor, same variables and dtype promotion, only the
kernels are jaxdnn's. A model switches by changing the module namespace, and checkpoints move
both ways. This notebook trains a small flax ResNet and an equinox CNN on the bundled 8x8
digits with each, from one initialisation, and compares them."""),
        ("code", """import time
import jax, jax.numpy as jnp, numpy as np, optax
import flax.linen as nn
import equinox as eqx
import jaxdnn, jaxdnn.flax, jaxdnn.equinox
from jaxdnn.examples.data import load_digits

data = load_digits()
batches = [(data.x_train[i:i + 128], data.y_train[i:i + 128])
           for i in range(0, len(data.x_train) - 127, 128)]
print(data.x_train.shape, len(batches), "batches per epoch")"""),
        ("md", """## A flax ResNet
The model takes its layer namespace as an argument: `nn` for stock flax, `jaxdnn.flax` for
jaxdnn (`Dense` and `relu` stay flax's)."""),
        ("code", """class ResNet(nn.Module):
    layers: object  # nn or jaxdnn.flax

    @nn.compact
    def __call__(self, x, train: bool):
        L = self.layers
        bn = lambda: L.BatchNorm(use_running_average=not train, momentum=0.9)
        x = nn.relu(bn()(L.Conv(16, (3, 3), use_bias=False)(x)))
        for width, stride in [(16, 1), (32, 2)]:
            h = nn.relu(bn()(L.Conv(width, (3, 3), strides=stride, use_bias=False)(x)))
            h = bn()(L.Conv(width, (3, 3), use_bias=False)(h))
            if stride != 1:
                x = bn()(L.Conv(width, (1, 1), strides=stride, use_bias=False)(x))
            x = nn.relu(x + h)
        return nn.Dense(10)(L.LayerNorm()(x.mean((1, 2))))

def train_flax(model, variables, epochs=3):
    tx = optax.adam(3e-3)
    params, stats = variables["params"], variables["batch_stats"]
    opt = tx.init(params)

    @jax.jit
    def step(params, stats, opt, x, y):
        def loss(p):
            logits, upd = model.apply({"params": p, "batch_stats": stats}, x, train=True,
                                      mutable=["batch_stats"])
            return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean(), upd
        (value, upd), grads = jax.value_and_grad(loss, has_aux=True)(params)
        updates, opt = tx.update(grads, opt, params)
        return optax.apply_updates(params, updates), upd["batch_stats"], opt, value

    losses = []
    for _ in range(epochs):
        for x, y in batches:
            params, stats, opt, value = step(params, stats, opt, x, y)
            losses.append(float(value))
    logits = model.apply({"params": params, "batch_stats": stats}, data.x_test, train=False)
    return losses, float((logits.argmax(-1) == data.y_test).mean()), {"params": params,
                                                                       "batch_stats": stats}

stock, ours = ResNet(nn), ResNet(jaxdnn.flax)
variables = stock.init(jax.random.key(0), data.x_train[:2], train=False)
# The stock checkpoint is the adapter's: same tree, names, shapes and dtypes.
assert jax.tree.structure(variables) == jax.tree.structure(
    ours.init(jax.random.key(0), data.x_train[:2], train=False))
runs = {}
for name, model in [("flax", stock), ("jaxdnn.flax", ours)]:
    t0 = time.perf_counter()
    runs[name] = train_flax(model, variables)
    print(f"{name:12s} final loss {runs[name][0][-1]:.4f}  test accuracy {runs[name][1]:.3f}  "
          f"({time.perf_counter() - t0:.1f} s with compilation)")
print("max |loss difference| over", len(runs["flax"][0]), "steps:",
      max(abs(a - b) for a, b in zip(runs["flax"][0], runs["jaxdnn.flax"][0])))"""),
        ("md", "The trained jaxdnn variables evaluate in the stock model (and the other way):"),
        ("code", """trained = runs["jaxdnn.flax"][2]
a = stock.apply(trained, data.x_test, train=False)
b = ours.apply(trained, data.x_test, train=False)
print("max |stock - jaxdnn| on the test logits:", float(jnp.max(jnp.abs(a - b))))
print([line for line in str(jax.make_jaxpr(lambda v: ours.apply(v, data.x_test, train=False))(
    trained)).split() if line.startswith("jaxdnn_")][:4])"""),
        ("md", """## An equinox CNN
Equinox layers take one example; the batch is a `jax.vmap`, with `axis_name` for the batch
norm's statistics, which live in an `eqx.nn.State`."""),
        ("code", """class CNN(eqx.Module):
    convs: list
    norms: list
    head: eqx.nn.Linear

    def __init__(self, layers, key):
        k = jax.random.split(key, 3)
        self.convs = [layers.Conv(2, 1, 16, 3, padding=1, key=k[0]),
                      layers.Conv(2, 16, 32, 3, stride=2, padding=1, key=k[1])]
        self.norms = [layers.BatchNorm(c, axis_name="batch", momentum=0.9, mode="batch") for c in (16, 32)]
        self.head = eqx.nn.Linear(32, 10, key=k[2])

    def __call__(self, x, state):
        for conv, norm in zip(self.convs, self.norms):
            x, state = norm(conv(x), state)
            x = jax.nn.relu(x)
        return self.head(x.mean((1, 2))), state

def train_eqx(model, state, epochs=3):
    tx = optax.adam(1e-2)
    opt = tx.init(eqx.filter(model, eqx.is_inexact_array))

    def loss(model, state, x, y):
        logits, state = jax.vmap(model, in_axes=(0, None), out_axes=(0, None),
                                 axis_name="batch")(x, state)
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean(), state

    @eqx.filter_jit
    def step(model, state, opt, x, y):
        (value, state), grads = eqx.filter_value_and_grad(loss, has_aux=True)(model, state, x, y)
        updates, opt = tx.update(grads, opt, model)
        return eqx.apply_updates(model, updates), state, opt, value

    losses = []
    for _ in range(epochs):
        for x, y in batches:
            model, state, opt, value = step(model, state, opt, x.transpose(0, 3, 1, 2), y)
            losses.append(float(value))
    test = jax.vmap(eqx.nn.inference_mode(model), in_axes=(0, None), out_axes=(0, None),
                    axis_name="batch")(data.x_test.transpose(0, 3, 1, 2), state)[0]
    return losses, float((test.argmax(-1) == data.y_test).mean())

stock_model, state = eqx.nn.make_with_state(CNN)(eqx.nn, jax.random.key(0))
template, _ = eqx.nn.make_with_state(CNN)(jaxdnn.equinox, jax.random.key(0))
# Same fields, so the stock model's leaves load into the jaxdnn one.
our_model = jax.tree.unflatten(jax.tree.structure(template), jax.tree.leaves(stock_model))
eqx_runs = {}
for name, model in [("equinox", stock_model), ("jaxdnn.equinox", our_model)]:
    t0 = time.perf_counter()
    eqx_runs[name] = train_eqx(model, state)
    print(f"{name:15s} final loss {eqx_runs[name][0][-1]:.4f}  test accuracy "
          f"{eqx_runs[name][1]:.3f}  ({time.perf_counter() - t0:.1f} s with compilation)")
print("max |loss difference|:", max(abs(a - b) for a, b in zip(eqx_runs["equinox"][0],
                                                              eqx_runs["jaxdnn.equinox"][0])))"""),
        ("md", """## Stock code unchanged: `jaxdnn.use_jaxdnn()`
Inside the block `jax.lax.conv_general_dilated` and `jax.lax.conv_transpose` are jaxdnn's, so
stock modules that call them (flax's `nn.Conv` and `nn.ConvTranspose`, equinox's convolutions)
trace to jaxdnn's kernels. JAX's caches are cleared on entry and exit: a function jitted
before the block would otherwise keep its lax convolutions, and one jitted inside would keep
jaxdnn's afterwards."""),
        ("code", """up = nn.ConvTranspose(8, (3, 3), strides=(2, 2))
v = up.init(jax.random.key(0), data.x_test[:4])
apply = jax.jit(up.apply)
lax_out = apply(v, data.x_test[:4])
with jaxdnn.use_jaxdnn():
    print(jaxdnn.explain(apply, v, data.x_test[:4]))
    ours_out = apply(v, data.x_test[:4])
print("max |difference|:", float(jnp.max(jnp.abs(lax_out - ours_out))))"""),
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
