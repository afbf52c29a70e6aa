"""Datasets for the examples, all local: no download ever happens.

* ``digits`` (default): the 8x8 handwritten digits bundled with scikit-learn (1797 images),
  split 80/20 with a fixed seed.
* ``--data DIR`` with MNIST in idx format (``train-images-idx3-ubyte`` etc., optionally
  ``.gz``) or CIFAR-10 python batches (``data_batch_1`` ... ``data_batch_5``, ``test_batch``).

Images come back as float32 NHWC in [0, 1] standardised per channel with the training
statistics; labels as int32.
"""

from __future__ import annotations

import dataclasses
import gzip
import os
import pickle

import numpy as np


@dataclasses.dataclass(frozen=True)
class Dataset:
    name: str
    x_train: np.ndarray  # (N, H, W, C) float32
    y_train: np.ndarray  # (N,) int32
    x_test: np.ndarray
    y_test: np.ndarray
    num_classes: int

    @property
    def image_shape(self) -> tuple[int, int, int]:
        return tuple(self.x_train.shape[1:])


def _standardise(name, x_train, y_train, x_test, y_test, num_classes) -> Dataset:
    mean = x_train.mean(axis=(0, 1, 2), keepdims=True)
    std = x_train.std(axis=(0, 1, 2), keepdims=True) + 1e-6
    return Dataset(name, ((x_train - mean) / std).astype(np.float32), y_train.astype(np.int32),
                   ((x_test - mean) / std).astype(np.float32), y_test.astype(np.int32),
                   num_classes)


def load_digits(seed: int = 0) -> Dataset:
    from sklearn.datasets import load_digits as sk_digits

    d = sk_digits()
    x = (d.images / 16.0).astype(np.float32)[..., None]  # (1797, 8, 8, 1)
    y = d.target
    order = np.random.default_rng(seed).permutation(len(x))
    split = int(0.8 * len(x))
    tr, te = order[:split], order[split:]
    return _standardise("digits", x[tr], y[tr], x[te], y[te], 10)


def _read_idx(path: str) -> np.ndarray:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    if data[0] != 0 or data[1] != 0 or data[2] != 0x08:
        raise ValueError(f"{path}: not an unsigned-byte idx file")
    ndim = data[3]
    shape = tuple(int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim))
    arr = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim)
    if arr.size != int(np.prod(shape)):
        raise ValueError(f"{path}: expected {shape} values, found {arr.size}")
    return arr.reshape(shape)


def _find(directory: str, stem: str) -> str | None:
    for name in (stem, stem + ".gz", stem.replace("-idx", ".idx"),
                 stem.replace("-idx", ".idx") + ".gz"):
        path = os.path.join(directory, name)
        if os.path.exists(path):
            return path
    return None


def load_mnist(directory: str) -> Dataset:
    files = {k: _find(directory, k) for k in ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                                              "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}
    missing = [k for k, v in files.items() if v is None]
    if missing:
        raise FileNotFoundError(f"{directory}: missing MNIST files {missing}")
    xs = [_read_idx(files[k]).astype(np.float32)[..., None] / 255.0
          for k in ("train-images-idx3-ubyte", "t10k-images-idx3-ubyte")]
    ys = [_read_idx(files[k]) for k in ("train-labels-idx1-ubyte", "t10k-labels-idx1-ubyte")]
    return _standardise("mnist", xs[0], ys[0], xs[1], ys[1], 10)


def load_cifar10(directory: str) -> Dataset:
    def batch(name):
        with open(os.path.join(directory, name), "rb") as f:
            d = pickle.load(f, encoding="bytes")
        x = np.asarray(d[b"data"], np.uint8).reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
        return x.astype(np.float32) / 255.0, np.asarray(d[b"labels"])

    train = [batch(f"data_batch_{i}") for i in range(1, 6)
             if os.path.exists(os.path.join(directory, f"data_batch_{i}"))]
    if not train or not os.path.exists(os.path.join(directory, "test_batch")):
        raise FileNotFoundError(f"{directory}: missing CIFAR-10 python batches")
    x_test, y_test = batch("test_batch")
    return _standardise("cifar10", np.concatenate([t[0] for t in train]),
                        np.concatenate([t[1] for t in train]), x_test, y_test, 10)


def load(data_dir: str | None, seed: int = 0) -> Dataset:
    """The digits set, or whatever MNIST/CIFAR-10 files `data_dir` holds."""
    if data_dir is None:
        return load_digits(seed)
    if not os.path.isdir(data_dir):
        raise FileNotFoundError(f"--data {data_dir}: not a directory")
    if _find(data_dir, "train-images-idx3-ubyte"):
        return load_mnist(data_dir)
    if os.path.exists(os.path.join(data_dir, "test_batch")):
        return load_cifar10(data_dir)
    raise FileNotFoundError(f"--data {data_dir}: found neither MNIST idx files nor CIFAR-10 "
                            "python batches")
