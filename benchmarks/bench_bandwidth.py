"""The memory-bandwidth ceiling of the current device, measured with the same harness as every
memory-bound benchmark (benchmarks/common.py time_op): an XLA elementwise kernel (-x, read N +
write N) over several sizes. On a GPU it also times a plain device-to-device copy with CUDA
events (through PyTorch, when installed) so the harness's own overhead is visible.

    python benchmarks/bench_bandwidth.py
"""

from __future__ import annotations

import jax
import numpy as np

from common import rotating_inputs, rotation_for, time_op, write_results

SIZES_MB = (64, 256, 512, 1024)


def torch_copy_gbps(nbytes: int) -> float | None:
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    a = torch.empty(nbytes // 4, dtype=torch.float32, device="cuda").normal_()
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(20):
        start.record()
        b.copy_(a)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return 2 * nbytes / np.median(times) / 1e9


def main():
    rows = []
    dev = jax.devices()[0]
    for mb in SIZES_MB if dev.platform == "gpu" else (64,):
        n = mb * (1 << 20) // 4
        inputs = rotating_inputs(lambda normal: (normal((n,)),), rotation_for(4 * n), device=dev)
        t = time_op(lambda x: -x, inputs, repeats=20)
        row = {"MB": mb, "xla_neg_us": t * 1e6, "xla_neg_GBps": 2 * 4 * n / t / 1e9}
        copy = torch_copy_gbps(4 * n) if dev.platform == "gpu" else None
        if copy is not None:
            row["torch_copy_GBps"] = copy
        rows.append(row)
    write_results("bandwidth", rows, ["MB", "xla_neg_us", "xla_neg_GBps", "torch_copy_GBps"],
                  notes="Ceiling for memory-bound ops: GB/s counting bytes read + written.")


if __name__ == "__main__":
    main()
