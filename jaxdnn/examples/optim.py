"""Two optimizers in plain JAX: SGD with momentum and Adam, plus a cosine learning-rate decay.
An optimizer is an (init, update) pair of pure functions over parameter pytrees, like optax,
in a few lines each. `learning_rate` is a number or a function of the step (0, 1, ...)."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp


class Optimizer(NamedTuple):
    init: Callable    # params -> state
    update: Callable  # (grads, state, params) -> (new_params, new_state)


def cosine_decay(peak: float, total_steps: int, final_fraction: float = 0.02) -> Callable:
    """peak at step 0, decaying along a half cosine to peak * final_fraction at total_steps."""
    def lr(step):
        t = jnp.minimum(step / max(total_steps, 1), 1.0)
        return peak * (final_fraction + (1 - final_fraction) * 0.5 * (1 + jnp.cos(jnp.pi * t)))
    return lr


def _schedule(learning_rate):
    return learning_rate if callable(learning_rate) else (lambda step: learning_rate)


def sgd(learning_rate, momentum: float = 0.9, weight_decay: float = 0.0) -> Optimizer:
    lr = _schedule(learning_rate)

    def init(params):
        return {"velocity": jax.tree.map(jnp.zeros_like, params), "step": jnp.zeros((), jnp.int32)}

    def update(grads, s, params):
        grads = jax.tree.map(lambda g, p: g + weight_decay * p, grads, params)
        velocity = jax.tree.map(lambda v, g: momentum * v + g, s["velocity"], grads)
        rate = lr(s["step"])
        params = jax.tree.map(lambda p, v: p - rate * v, params, velocity)
        return params, {"velocity": velocity, "step": s["step"] + 1}

    return Optimizer(init, update)


def adam(learning_rate, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8) -> Optimizer:
    lr = _schedule(learning_rate)

    def init(params):
        return {"m": jax.tree.map(jnp.zeros_like, params),
                "v": jax.tree.map(jnp.zeros_like, params), "step": jnp.zeros((), jnp.int32)}

    def update(grads, s, params):
        t = s["step"] + 1
        m = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, s["m"], grads)
        v = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, s["v"], grads)
        rate = lr(s["step"]) * jnp.sqrt(1 - b2 ** t) / (1 - b1 ** t)
        params = jax.tree.map(lambda p, m, v: p - rate * m / (jnp.sqrt(v) + eps), params, m, v)
        return params, {"m": m, "v": v, "step": t}

    return Optimizer(init, update)


OPTIMIZERS = {"sgd": sgd, "adam": adam}
