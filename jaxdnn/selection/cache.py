"""The persistent benchmark cache ("find" results), keyed by family, device, jaxdnn version
and problem.

One JSON file per (family, platform, device) in the cache directory, named
``<family>-<platform>-<device>.json`` (e.g. ``conv-cuda-NVIDIA_H200_sm_90.json``)::

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
import time
import warnings

import jax

FORMAT = 2
STALE_TMP_S = 3600  # a temporary cache file this old, found under the lock, is a dead writer's


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
    """Benchmark results of one family on one platform/device, in memory and on disk under
    `directory`.

    The disk is an optimisation, never a requirement: when the cache file or its directory
    cannot be read or written (a read-only or missing-permission directory, a `directory`
    that is a regular file, a cache path that is a directory, a full disk), the cache warns
    once and from then on keeps results in memory only, for this process."""

    def __init__(self, directory: str, family: str, platform: str, version: str,
                 device: str | None = None):
        self.device = device or device_identity(platform)
        self.version = version
        self.path = os.path.join(directory, f"{family}-{platform}-{_slug(self.device)}.json")
        self._memory: dict[str, list[dict]] | None = None
        self._disk = True  # False once the disk has failed: memory only from then on
        self._lock = threading.Lock()

    def _disk_failed(self, error: OSError) -> None:
        if self._disk:
            warnings.warn(f"jaxdnn: tuning cache {self.path} cannot be used ({error}); "
                          "benchmark results are kept in memory only, for this process",
                          RuntimeWarning, stacklevel=4)
        self._disk = False

    def _read_disk(self) -> dict[str, list[dict]]:
        """The file's entries: empty when there is no file yet, or (with a warning) when its
        content is not a cache of this device and version. Raises OSError when the file
        cannot be read."""
        try:
            with open(self.path) as f:
                doc = json.load(f)
        except FileNotFoundError:
            return {}
        except ValueError as e:
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

    def _load(self) -> None:
        """Fills the memory from the disk on first use (call with self._lock held)."""
        if self._memory is None:
            self._memory = {}
            if self._disk:
                try:
                    self._memory = self._read_disk()
                except OSError as e:
                    self._disk_failed(e)

    def get(self, key: str) -> list[dict] | None:
        with self._lock:
            self._load()
            return self._memory.get(key)

    def put(self, key: str, results: list[dict]) -> None:
        with self._lock:
            self._load()
            self._memory[key] = results
            if not self._disk:
                return
            try:
                self._memory = self._write(key, results)
            except OSError as e:
                self._disk_failed(e)

    def _write(self, key: str, results: list[dict]) -> dict[str, list[dict]]:
        """Merges `key` into the file under its lock; returns the merged entries."""
        directory = os.path.dirname(self.path)
        os.makedirs(directory, exist_ok=True)
        with _file_lock(self.path + ".lock"):
            entries = self._read_disk()  # merge what other processes wrote meanwhile
            entries[key] = results
            doc = {"format": FORMAT, "jaxdnn": self.version, "device": self.device,
                   "entries": entries}
            self._remove_stale_temporaries()
            fd, tmp = tempfile.mkstemp(dir=directory, prefix=self._tmp_prefix(), suffix=".tmp")
            try:
                with os.fdopen(fd, "w") as f:
                    json.dump(doc, f, indent=0, sort_keys=True)
                os.replace(tmp, self.path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
        return entries

    def _tmp_prefix(self) -> str:
        return os.path.basename(self.path) + "."

    def _remove_stale_temporaries(self) -> None:
        """Deletes this cache's temporary files that a writer left when it died mid-write.
        Writers create and rename them while they hold the file lock, which the caller holds,
        so none is in use; the age threshold is a second guard, for file systems whose flock
        does not exclude other hosts."""
        directory = os.path.dirname(self.path)
        cutoff = time.time() - STALE_TMP_S
        prefix = self._tmp_prefix()
        for name in os.listdir(directory):
            if name.startswith(prefix) and name.endswith(".tmp"):
                with contextlib.suppress(OSError):
                    stale = os.lstat(os.path.join(directory, name)).st_mtime < cutoff
                    if stale:
                        os.unlink(os.path.join(directory, name))


_caches: dict[tuple, TuningCache] = {}
_caches_lock = threading.Lock()


def cache_for(directory: str, family: str, platform: str, version: str) -> TuningCache:
    """The process's one cache of `family` on this device of `platform`."""
    key = (directory, family, platform, version)
    with _caches_lock:
        if key not in _caches:
            _caches[key] = TuningCache(directory, family, platform, version)
        return _caches[key]
