"""Two optimizers in plain JAX: SGD with momentum and Adam. An optimizer is an (init, update)
pair of pure functions over parameter pytrees, like optax, in a dozen lines."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp


class Optimizer(NamedTuple):
    init: callable
    update: callable  # (grads, opt_state, params) -> (new_params, new_opt_state)


def sgd(learning_rate: float, momentum: float = 0.9, weight_decay: float = 0.0) -> Optimizer:
    def init(params):
        return jax.tree.map(jnp.zeros_like, params)

    def update(grads, velocity, params):
        grads = jax.tree.map(lambda g, p: g + weight_decay * p, grads, params)
        velocity = jax.tree.map(lambda v, g: momentum * v + g, velocity, grads)
        params = jax.tree.map(lambda p, v: p - learning_rate * v, params, velocity)
        return params, velocity

    return Optimizer(init, update)


def adam(learning_rate: float, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8) -> Optimizer:
    def init(params):
        return {"m": jax.tree.map(jnp.zeros_like, params),
                "v": jax.tree.map(jnp.zeros_like, params), "t": jnp.zeros((), jnp.int32)}

    def update(grads, s, params):
        t = s["t"] + 1
        m = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, s["m"], grads)
        v = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, s["v"], grads)
        step = learning_rate * jnp.sqrt(1 - b2 ** t) / (1 - b1 ** t)
        params = jax.tree.map(lambda p, m, v: p - step * m / (jnp.sqrt(v) + eps), params, m, v)
        return params, {"m": m, "v": v, "t": t}

    return Optimizer(init, update)


OPTIMIZERS = {"sgd": sgd, "adam": adam}
