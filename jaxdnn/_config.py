"""Library settings for algorithm selection: benchmark mode, determinism, workspace limit and
the tuning-cache directory.

``jaxdnn.config(...)`` changes the settings at once and returns a context manager that puts
the previous ones back on exit, so it works both ways::

    jaxdnn.config(deterministic=True)            # from now on
    with jaxdnn.config(benchmark=True):          # only inside the block
        y = jax.jit(f)(x)

Defaults come from the environment: ``JAXDNN_BENCHMARK``, ``JAXDNN_DETERMINISTIC`` (``1`` /
``0``), ``JAXDNN_WORKSPACE_LIMIT`` (bytes, with an optional K/M/G suffix) and
``JAXDNN_CACHE_DIR`` (default ``$XDG_CACHE_HOME/jaxdnn`` or ``~/.cache/jaxdnn``).

Settings are read when a jaxdnn op is *traced* and recorded in the traced program, like the
algorithm itself. They are part of ``jax.jit``'s cache key (as jax's own
``default_matmul_precision`` is), so a jitted function called under other settings is traced
and compiled again with its algorithms chosen under them; a compiled executable
(``jax.jit(f).lower(...).compile()``) keeps its choices.
"""

from __future__ import annotations

import dataclasses
import math
import os
import threading

import numpy as np

_UNSET = object()


@dataclasses.dataclass(frozen=True)
class Settings:
    benchmark: bool = False
    deterministic: bool = False
    workspace_limit: int | None = None  # bytes; None = no limit
    cache_dir: str = ""

    def policy(self) -> tuple[bool, bool, int]:
        """The part that changes which algorithm runs, as a hashable primitive parameter:
        (benchmark, deterministic, workspace_limit or -1)."""
        limit = -1 if self.workspace_limit is None else self.workspace_limit
        return (self.benchmark, self.deterministic, limit)


def _parse_bool(name: str, value: str) -> bool:
    v = value.strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"{name}={value!r}: expected 1/0, true/false, yes/no or on/off")


def _parse_bytes(name: str, value: str) -> int | None:
    v = value.strip().upper()
    if v in ("", "NONE"):
        return None
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(v[-1:], 1)
    try:
        f = float(v[:-1] if scale != 1 else v) * scale
    except ValueError:
        raise ValueError(f"{name}={value!r}: expected a number of bytes, e.g. 0, 512M") from None
    if not math.isfinite(f):  # inf, nan, or a literal beyond float range such as 1e400
        raise ValueError(f"{name}={value!r}: expected a finite number of bytes, e.g. 0, 512M")
    n = int(f)
    if n < 0:
        raise ValueError(f"{name}={value!r}: must not be negative")
    return n


def _default_cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "jaxdnn")


def from_environment(env=os.environ) -> Settings:
    return Settings(
        benchmark=_parse_bool("JAXDNN_BENCHMARK", env.get("JAXDNN_BENCHMARK", "0")),
        deterministic=_parse_bool("JAXDNN_DETERMINISTIC", env.get("JAXDNN_DETERMINISTIC", "0")),
        workspace_limit=_parse_bytes("JAXDNN_WORKSPACE_LIMIT",
                                     env.get("JAXDNN_WORKSPACE_LIMIT", "")),
        cache_dir=env.get("JAXDNN_CACHE_DIR") or _default_cache_dir(),
    )


def _jit_key_state():
    """A jax config state that holds the settings in force, included in ``jax.jit``'s cache
    key, so that a function traced under other settings is traced again (and its algorithms
    chosen again), as jax does for its own ``default_matmul_precision``. None where this jax
    has no such state (then a changed setting reaches only functions traced after it)."""
    try:
        from jax._src import config as jax_config

        state = jax_config.string_or_object_state
    except (ImportError, AttributeError):
        return None
    name, help_text = "jaxdnn_settings", "jaxdnn.config's settings (set through jaxdnn.config)"
    try:  # the tracing caches' key as well as the dispatch cache's
        return state(name, None, help_text, include_in_jit_key=True,
                     include_in_trace_context=True)
    except TypeError:  # a jax whose states have no trace-context flag
        return state(name, None, help_text, include_in_jit_key=True)


_lock = threading.Lock()
_jit_key = _jit_key_state()


def _set(settings: Settings) -> None:
    """Puts `settings` in force (call with _lock held)."""
    global _current
    _current = settings
    if _jit_key is not None:
        _jit_key.set_global(settings)


_current: Settings
_set(from_environment())


def settings() -> Settings:
    """The settings in force now."""
    return _current


class config:  # noqa: N801  (used like a function)
    """Changes settings now; as a context manager, restores the previous ones on exit.

    Args:
      benchmark: time the applicable algorithms the first time a problem is traced and use
        the fastest (results cached in memory and on disk).
      deterministic: only algorithms whose results are bitwise reproducible.
      workspace_limit: bytes of scratch memory an algorithm may use (0: none); None: no limit.
      cache_dir: where benchmark results persist.
    """

    def __init__(self, *, benchmark=_UNSET, deterministic=_UNSET, workspace_limit=_UNSET,
                 cache_dir=_UNSET):
        changes = {}
        for name, value in (("benchmark", benchmark), ("deterministic", deterministic)):
            if value is not _UNSET:
                if not isinstance(value, (bool, np.bool_)):
                    raise TypeError(f"jaxdnn.config: `{name}` must be a bool, got {value!r}")
                changes[name] = bool(value)
        if workspace_limit is not _UNSET:
            if workspace_limit is not None and (not isinstance(workspace_limit,
                                                               (int, np.integer))
                                                or isinstance(workspace_limit, bool)
                                                or workspace_limit < 0):
                raise ValueError("jaxdnn.config: `workspace_limit` must be None or a "
                                 f"non-negative number of bytes, got {workspace_limit!r}")
            changes["workspace_limit"] = None if workspace_limit is None else int(workspace_limit)
        if cache_dir is not _UNSET:
            if not isinstance(cache_dir, (str, os.PathLike)):
                raise TypeError(f"jaxdnn.config: `cache_dir` must be a path, got {cache_dir!r}")
            changes["cache_dir"] = os.fspath(cache_dir)
        with _lock:
            self._previous = _current
            _set(dataclasses.replace(_current, **changes))

    def __enter__(self) -> Settings:
        return _current

    def __exit__(self, *exc) -> None:
        with _lock:
            _set(self._previous)

    def __repr__(self) -> str:
        return f"jaxdnn.config({_current})"
