"""Test-suite setup: float64 on, outputs poisoned, GPU tests required where asked, and a count
of the GPU tests that ran."""

import os

# Every jaxdnn handler fills its outputs with NaN before its kernel runs (cc/ffi/common.h), so
# an element a kernel forgets to write fails the comparison. Must be set before the first call.
os.environ.setdefault("JAXDNN_POISON_OUTPUTS", "1")

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_enable_x64", True)

# JAXDNN_REQUIRE_GPU=1 (dev/device.sh, on the GPU machine): a test skipped for want of a GPU or
# of the CUDA module fails instead (its skip reason starts with util.GPU_SKIP), and so does a
# run in which no GPU test passed.
REQUIRE_GPU = os.environ.get("JAXDNN_REQUIRE_GPU", "0") not in ("", "0")
GPU_SKIP = "no usable GPU"  # = util.GPU_SKIP (util is not importable from every conftest user)


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU (skipped without one)")


def _skip_reason(report) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2])
    return str(longrepr)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if REQUIRE_GPU and report.skipped and not hasattr(report, "wasxfail"):
        reason = _skip_reason(report)
        if GPU_SKIP in reason:
            report.outcome = "failed"
            report.longrepr = f"JAXDNN_REQUIRE_GPU=1, but the test was skipped: {reason}"
    return report


def pytest_collection_modifyitems(config, items):
    """Tests parametrised on the "gpu" platform get the gpu marker too."""
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        if any(isinstance(v, str) and v == "gpu" for v in params.values()):
            item.add_marker(pytest.mark.gpu)


def _is_gpu_test(report) -> bool:
    """A test that runs on the GPU: the gpu marker (tests/util.py's needs_gpu, or a "gpu"
    parameter). Names are not enough: test_gpu_heuristic_* run on the CPU."""
    return "gpu" in getattr(report, "keywords", {})


def _gpu_counts(stats) -> dict:
    """{outcome: number of GPU tests} from the terminal reporter's stats, one outcome per
    test (a test that passed its call but errored in teardown counts as failed)."""
    seen: dict = {}
    for outcome in ("passed", "skipped", "failed", "error"):
        for r in stats.get(outcome, ()):
            if not hasattr(r, "nodeid") or not _is_gpu_test(r):
                continue
            if outcome == "passed" and r.when != "call":
                continue
            kind = "failed" if outcome == "error" else outcome
            if seen.get(r.nodeid) != "failed":
                seen[r.nodeid] = kind
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    for kind in seen.values():
        counts[kind] += 1
    return counts


def _reporter(config):
    if hasattr(config, "workerinput"):  # an xdist worker: the controller reports
        return None
    return config.pluginmanager.get_plugin("terminalreporter")


def pytest_sessionfinish(session, exitstatus):
    tr = _reporter(session.config)
    if tr is not None and REQUIRE_GPU and _gpu_counts(tr.stats)["passed"] == 0 \
            and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if _reporter(config) is None:
        return
    c = _gpu_counts(terminalreporter.stats)
    line = f"GPU tests: {c['passed']} passed, {c['failed']} failed, {c['skipped']} skipped"
    if REQUIRE_GPU:
        line += " (JAXDNN_REQUIRE_GPU=1)"
    terminalreporter.write_line(line, bold=True)
    if REQUIRE_GPU and c["passed"] == 0:
        terminalreporter.write_line("JAXDNN_REQUIRE_GPU=1, but no GPU test passed", red=True,
                                    bold=True)
