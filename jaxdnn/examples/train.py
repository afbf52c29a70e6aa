"""Training loop and command line shared by ``train_cnn`` and ``train_mlp``.

Plain JAX: parameters are pytrees, one ``jax.jit(jax.value_and_grad(loss))`` step, optimizers
from ``optim.py``, batch-norm running statistics carried as state (batch statistics while
training, running statistics for evaluation). Runs on the GPU when jax has one.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import jaxdnn

from . import data as data_lib
from .models import MODELS, jaxdnn_ops, lax_ops, loss_fn, predict
from .optim import OPTIMIZERS, cosine_decay

# Per model: epochs, batch size, optimizer, peak learning rate. Training a ReLU/max-pool network
# is chaotic: a float32 rounding difference flips a max-pool argmax or a ReLU sign now and
# then, and the flip grows. At these rates jaxdnn and jax.lax stay within 1e-4 of each other
# for 50 steps (--compare-lax); at SGD lr=0.05 the step gradients still agree to 1e-6 but the
# losses drift ~1e-2 apart by step 50.
DEFAULTS = {
    "cnn": dict(epochs=12, batch_size=64, optimizer="sgd", lr=1e-2),
    "mlp": dict(epochs=20, batch_size=64, optimizer="adam", lr=1e-3),
}


def parse_args(model: str, argv=None) -> argparse.Namespace:
    d = DEFAULTS[model]
    p = argparse.ArgumentParser(
        prog=f"python -m jaxdnn.examples.train_{model}",
        description=f"Train the {model.upper()} with jaxdnn's primitives (no Flax).")
    p.add_argument("--data", metavar="DIR", default=None,
                   help="MNIST (idx files) or CIFAR-10 (python batches) directory; default: "
                        "scikit-learn's bundled 8x8 digits")
    p.add_argument("--epochs", type=int, default=d["epochs"])
    p.add_argument("--batch-size", type=int, default=d["batch_size"])
    p.add_argument("--optimizer", choices=sorted(OPTIMIZERS), default=d["optimizer"])
    p.add_argument("--lr", type=float, default=d["lr"],
                   help="peak learning rate (cosine decay over the run)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                   help="compute dtype of the forward/backward pass (parameters stay float32)")
    p.add_argument("--algo", default=None, help="force a convolution algorithm (e.g. direct)")
    p.add_argument("--benchmark", action="store_true",
                   help="time the convolution algorithms once per shape and keep the fastest")
    p.add_argument("--devices", type=int, default=1,
                   help="data parallel over the first N devices: batches sharded over a 1-D "
                        "mesh, parameters replicated, batch-norm statistics synchronised (on "
                        "the CPU, XLA_FLAGS=--xla_force_host_platform_device_count=N makes N)")
    p.add_argument("--compare-lax", action="store_true",
                   help="train the same model with jax.lax/jax.nn ops from the same "
                        "initialisation for --compare-steps steps; report losses and speed")
    p.add_argument("--compare-steps", type=int, default=50)
    p.add_argument("--plot", default=f"train_{model}.png", metavar="PNG",
                   help="where to save the loss/accuracy plot ('' to skip)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = p.parse_args(argv)
    args.model = model
    for name in ("epochs", "batch_size", "compare_steps", "devices"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.devices > len(jax.devices()):
        p.error(f"--devices {args.devices}: jax sees {len(jax.devices())} device(s)")
    if args.batch_size % args.devices:
        p.error(f"--batch-size {args.batch_size} must be a multiple of --devices {args.devices}")
    return args


def placement(devices):
    """(put_batch, put_replicated): where a batch and the model's pytrees go for data-parallel
    training over a 1-D mesh of `devices`. Plain jit partitions the step from these shardings
    (jaxdnn's ops carry partitioning rules): each device computes its slice of the batch."""
    mesh = Mesh(np.array(devices), ("data",))
    batch, replicated = NamedSharding(mesh, P("data")), NamedSharding(mesh, P())
    return (lambda a: jax.device_put(a, batch)), (lambda t: jax.device_put(t, replicated))


def data_parallel(n: int):
    """placement() over the first n devices; for one, no mesh (arrays stay where jax puts them)."""
    if n == 1:
        return (lambda a: a), (lambda t: t)
    return placement(jax.devices()[:n])


@dataclasses.dataclass
class Trainer:
    """One model + optimizer, with jitted train and predict steps."""

    apply: callable
    ops: object
    dtype: object
    opt: object

    def __post_init__(self):
        loss = partial(loss_fn, self.apply, self.ops, self.dtype)

        def step(params, state, opt_state, x, y):
            (value, new_state), grads = jax.value_and_grad(loss, has_aux=True)(params, state, x, y)
            params, opt_state = self.opt.update(grads, opt_state, params)
            return params, new_state, opt_state, value

        self.step = jax.jit(step, donate_argnums=(0, 1, 2))
        self.predict = jax.jit(partial(predict, self.apply, self.ops, self.dtype))

    def accuracy(self, params, state, x, y, batch_size, put_batch=lambda a: a):
        correct = 0
        for i in range(0, len(x), batch_size):
            xb = x[i:i + batch_size]
            pad = batch_size - len(xb)  # one compiled shape: pad the last batch
            if pad:
                xb = np.concatenate([xb, np.zeros((pad, *xb.shape[1:]), xb.dtype)])
            pred = np.asarray(self.predict(params, state, put_batch(xb)))[:batch_size - pad]
            correct += int((pred == y[i:i + batch_size]).sum())
        return correct / len(x)


def batches(rng, n, batch_size):
    """Shuffled index batches of exactly `batch_size` (the remainder is dropped)."""
    order = rng.permutation(n)
    for i in range(0, n - batch_size + 1, batch_size):
        yield order[i:i + batch_size]


def _progress(total, desc, disable):
    try:
        from tqdm import tqdm
    except ImportError:  # the bar is optional
        return None
    return tqdm(total=total, desc=desc, unit="step", disable=disable, mininterval=0.5,
                file=sys.stdout, dynamic_ncols=True, leave=False)


def train(args) -> dict:
    ds = data_lib.load(args.data, args.seed)
    if args.batch_size > len(ds.x_train):
        raise SystemExit(f"--batch-size {args.batch_size} exceeds the {len(ds.x_train)} "
                         "training images")
    dtype = jnp.dtype(args.dtype)
    init, apply = MODELS[args.model]
    params, state = init(jax.random.key(args.seed), ds.image_shape, ds.num_classes)
    steps_per_epoch = len(ds.x_train) // args.batch_size
    opt = OPTIMIZERS[args.optimizer](cosine_decay(args.lr, args.epochs * steps_per_epoch))
    trainer = Trainer(apply, jaxdnn_ops(args.algo), dtype, opt)
    put_batch, put_replicated = data_parallel(args.devices)
    params, state, opt_state = put_replicated((params, state, opt.init(params)))
    print(f"jaxdnn {args.model} on {ds.name}: {len(ds.x_train)} train / {len(ds.x_test)} test "
          f"images {ds.image_shape}, {args.dtype}, batch {args.batch_size}, {args.optimizer} "
          f"lr {args.lr}, {args.devices} x {jax.devices()[0].device_kind}")
    if args.benchmark:  # time the applicable conv algorithms once per shape, cache the winner
        jaxdnn.config(benchmark=True)

    rng = np.random.default_rng(args.seed)
    history = {"step_loss": [], "epoch_acc": []}
    timed_images, timed_seconds = 0, 0.0
    for epoch in range(1, args.epochs + 1):
        bar = _progress(steps_per_epoch, f"epoch {epoch}/{args.epochs}", args.no_progress)
        t0 = time.perf_counter()
        losses = []
        for idx in batches(rng, len(ds.x_train), args.batch_size):
            params, state, opt_state, loss = trainer.step(
                params, state, opt_state, put_batch(ds.x_train[idx]), put_batch(ds.y_train[idx]))
            losses.append(loss)
            if bar is not None:
                bar.update(1)
                if bar.n % 10 == 0 or bar.n == steps_per_epoch:
                    value = float(loss)  # waits for the step, so the rate below is real
                    rate = bar.n * args.batch_size / (time.perf_counter() - t0)
                    bar.set_postfix(loss=f"{value:.4f}", img_s=f"{rate:.0f}")
        losses = [float(v) for v in jax.block_until_ready(losses)]
        seconds = time.perf_counter() - t0
        if bar is not None:
            bar.close()
        if epoch > 1:  # the first epoch includes compilation
            timed_images += steps_per_epoch * args.batch_size
            timed_seconds += seconds
        acc = trainer.accuracy(params, state, ds.x_test, ds.y_test, args.batch_size, put_batch)
        history["step_loss"] += losses
        history["epoch_acc"].append(acc)
        print(f"epoch {epoch:3d}  loss {np.mean(losses):.4f}  test accuracy {acc:.4f}  "
              f"{steps_per_epoch * args.batch_size / seconds:8.0f} img/s")
    images_per_s = timed_images / timed_seconds if timed_seconds else float("nan")
    result = {"test_accuracy": history["epoch_acc"][-1], "images_per_s": images_per_s,
              "history": history}
    print(f"final test accuracy {result['test_accuracy']:.4f}; training throughput "
          f"{images_per_s:.0f} images/s (epochs 2-{args.epochs})")
    if args.plot:
        save_plot(args.plot, history, f"jaxdnn {args.model} on {ds.name} ({args.dtype})")
        print(f"saved {args.plot}")
    return result


def compare_lax(args) -> dict:
    """The same model and batches on jaxdnn and on jax.lax/jax.nn from one initialisation."""
    ds = data_lib.load(args.data, args.seed)
    dtype = jnp.dtype(args.dtype)
    init, apply = MODELS[args.model]
    params0, state0 = init(jax.random.key(args.seed), ds.image_shape, ds.num_classes)
    rng = np.random.default_rng(args.seed)
    idx = []
    while len(idx) < args.compare_steps:  # the same batches for both
        idx.extend(batches(rng, len(ds.x_train), args.batch_size))
    idx = idx[:args.compare_steps]
    rows = {}
    put_batch, put_replicated = data_parallel(args.devices)
    for ops in (jaxdnn_ops(args.algo), lax_ops()):
        opt = OPTIMIZERS[args.optimizer](cosine_decay(args.lr, args.compare_steps))
        trainer = Trainer(apply, ops, dtype, opt)
        params, state = jax.tree.map(jnp.array, (params0, state0))
        params, state, opt_state = put_replicated((params, state, opt.init(params)))
        warm = min(5, len(idx) - 1)
        for i, b in enumerate(idx):
            if i == warm:
                jax.block_until_ready(params)
                t0 = time.perf_counter()
            params, state, opt_state, loss = trainer.step(
                params, state, opt_state, put_batch(ds.x_train[b]), put_batch(ds.y_train[b]))
        loss = float(loss)
        seconds = time.perf_counter() - t0
        rows[ops.name] = {"loss": loss, "images_per_s": (len(idx) - warm) * args.batch_size /
                          seconds}
    a, b = rows["jaxdnn"], rows["jax.lax"]
    rel = abs(a["loss"] - b["loss"]) / abs(b["loss"])
    print(f"after {args.compare_steps} {args.dtype} steps (batch {args.batch_size}, "
          f"{args.devices} x {jax.devices()[0].device_kind}):")
    for name, r in rows.items():
        print(f"  {name:8s} loss {r['loss']:.6f}  {r['images_per_s']:9.0f} images/s")
    print(f"  relative loss difference {rel:.2e}; speed ratio jaxdnn / jax.lax "
          f"{a['images_per_s'] / b['images_per_s']:.2f}x")
    return {"rows": rows, "relative_loss_difference": rel}


def save_plot(path, history, title):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.6))
    loss = np.asarray(history["step_loss"])
    ax1.plot(loss, alpha=0.35, lw=0.8, label="step")
    k = max(1, len(loss) // 50)
    ax1.plot(np.arange(k - 1, len(loss)), np.convolve(loss, np.ones(k) / k, "valid"),
             label=f"mean of {k}")
    ax1.set(xlabel="step", ylabel="training loss", yscale="log", title="loss")
    ax1.legend()
    acc = history["epoch_acc"]
    ax2.plot(range(1, len(acc) + 1), acc, marker="o")
    ax2.set(xlabel="epoch", ylabel="test accuracy", title="accuracy", ylim=(min(acc) - 0.02, 1.0))
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(model: str, argv=None):
    args = parse_args(model, argv)
    return compare_lax(args) if args.compare_lax else train(args)
