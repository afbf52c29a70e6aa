"""Flax-free training examples built on jaxdnn's primitives (``train_cnn``, ``train_mlp``)."""
