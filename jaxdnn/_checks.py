"""Argument checks shared by every op family: array arguments, their dtypes and their byte
sizes. Errors name the calling function and the argument, e.g. "jaxdnn.conv: `w` ...".
"""

from __future__ import annotations

import math
import operator

import jax.numpy as jnp
import numpy as np

SUPPORTED_DTYPES = tuple(np.dtype(d) for d in (jnp.float32, jnp.float64, jnp.float16,
                                                jnp.bfloat16))

# XLA indexes buffers with int64: an array of more bytes than this aborts the compiler.
MAX_BYTES = 2**63 - 1


def as_array(value, name: str, api: str):
    """`value` as a jax array; TypeError naming the argument when it is not array-like (None,
    strings, objects, ragged lists)."""
    try:
        return jnp.asarray(value)
    except (TypeError, ValueError) as e:
        raise TypeError(f"{api}: `{name}` must be an array, got {type(value).__name__}") from e


def check_nbytes(shape, dtype, what: str) -> None:
    """ValueError when an array of `shape` and `dtype` holds more bytes than XLA can index;
    `what` names it ("jaxdnn.relu: `x`")."""
    if not all(isinstance(d, (int, np.integer)) for d in shape):
        return  # symbolic dimensions: their values are not known while tracing
    nbytes = math.prod(int(d) for d in shape) * np.dtype(dtype).itemsize
    if nbytes > MAX_BYTES:
        raise ValueError(f"{what} of shape {tuple(shape)} and dtype {np.dtype(dtype).name} "
                         f"would take {nbytes} bytes, more than the {MAX_BYTES} an XLA buffer "
                         "can hold")


def operand(value, name: str, api: str, dtypes=SUPPORTED_DTYPES):
    """An array argument of a jaxdnn op: converted, its dtype one of `dtypes` (TypeError;
    default: the floating-point SUPPORTED_DTYPES) and its byte size within XLA's limit
    (ValueError)."""
    x = as_array(value, name, api)
    if np.dtype(x.dtype) not in dtypes:
        names = [np.dtype(d).name for d in dtypes]
        raise TypeError(f"{api}: `{name}` has dtype {x.dtype}; supported dtypes are "
                        f"{', '.join(names[:-1])} and {names[-1]}")
    check_nbytes(x.shape, x.dtype, f"{api}: `{name}`")
    return x


def positive_int(value, name: str, api: str) -> int:
    """`value` as an int >= 1: TypeError for non-integers (bools included), ValueError for
    integers below 1."""
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{api}: `{name}` must be a positive int, got {value!r}")
    try:
        n = operator.index(value)
    except TypeError:
        raise TypeError(f"{api}: `{name}` must be a positive int, got {value!r}") from None
    if n < 1:
        raise ValueError(f"{api}: `{name}` must be a positive int, got {n}")
    return n
