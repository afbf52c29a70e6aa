"""The persistent benchmark cache ("find" results), keyed by device, jaxdnn version and problem.

One JSON file per (platform, device) in the cache directory::

    {"format": 1, "jaxdnn": "0.1.0", "device": "NVIDIA H200 sm_90",
     "entries": {"<problem key>": [{"name": ..., "time_s": ..., "ok": ..., ...}, ...]}}

Writers take an exclusive lock on ``<file>.lock``, re-read the file, merge their entry and
replace the file atomically (write to a temporary file, then ``os.replace``), so two processes
tuning at once both keep their results and a reader never sees half a file. A file that does
not parse, or that belongs to another device or version, is reported with a warning and
rebuilt; it never stops a program.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
import threading
import warnings

import jax

FORMAT = 1


def device_identity(platform: str) -> str:
    """A name that changes when tuning results stop being valid: GPU model and compute
    capability, or CPU model and core count."""
    if platform == "cuda":
        d = jax.devices("gpu")[0]
        return f"{d.device_kind} sm_{getattr(d, 'compute_capability', '?')}"
    model = "cpu"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{model} x{os.cpu_count()}"


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_")


@contextlib.contextmanager
def _file_lock(path: str):
    import fcntl

    with open(path, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


class TuningCache:
    """Benchmark results for one platform/device, in memory and on disk under `directory`."""

    def __init__(self, directory: str, platform: str, version: str, device: str | None = None):
        self.device = device or device_identity(platform)
        self.version = version
        self.path = os.path.join(directory, f"conv-{platform}-{_slug(self.device)}.json")
        self._memory: dict[str, list[dict]] | None = None
        self._lock = threading.Lock()

    def _read_disk(self) -> dict[str, list[dict]]:
        try:
            with open(self.path) as f:
                doc = json.load(f)
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as e:
            warnings.warn(f"jaxdnn: tuning cache {self.path} is unreadable ({e}); rebuilding it",
                          RuntimeWarning, stacklevel=3)
            return {}
        if (not isinstance(doc, dict) or doc.get("format") != FORMAT
                or doc.get("jaxdnn") != self.version or doc.get("device") != self.device
                or not isinstance(doc.get("entries"), dict)):
            warnings.warn(f"jaxdnn: tuning cache {self.path} was written by another jaxdnn "
                          "version or device, or is malformed; rebuilding it", RuntimeWarning,
                          stacklevel=3)
            return {}
        return doc["entries"]

    def get(self, key: str) -> list[dict] | None:
        with self._lock:
            if self._memory is None:
                self._memory = self._read_disk()
            return self._memory.get(key)

    def put(self, key: str, results: list[dict]) -> None:
        with self._lock:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            with _file_lock(self.path + ".lock"):
                entries = self._read_disk()  # merge what other processes wrote meanwhile
                entries[key] = results
                doc = {"format": FORMAT, "jaxdnn": self.version, "device": self.device,
                       "entries": entries}
                fd, tmp = tempfile.mkstemp(dir=os.path.dirname(self.path), suffix=".tmp")
                try:
                    with os.fdopen(fd, "w") as f:
                        json.dump(doc, f, indent=0, sort_keys=True)
                    os.replace(tmp, self.path)
                except BaseException:
                    with contextlib.suppress(OSError):
                        os.unlink(tmp)
                    raise
            self._memory = entries


_caches: dict[tuple, TuningCache] = {}
_caches_lock = threading.Lock()


def cache_for(directory: str, platform: str, version: str) -> TuningCache:
    key = (directory, platform, version)
    with _caches_lock:
        if key not in _caches:
            _caches[key] = TuningCache(directory, platform, version)
        return _caches[key]
