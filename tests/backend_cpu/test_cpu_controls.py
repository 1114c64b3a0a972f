"""kael.cpu, the one home of the CPU thread and memory controls, with the native backend.

Every other spelling (kael.set_num_threads, kael_backend_cpu.*, the CpuBackend methods)
must reach the same thread pool and allocator, bad thread counts must fail the same way
everywhere, and with the reference backend serving cpu kael.cpu must report "no pool, no
allocator" while kael_backend_cpu's functions still act on the native ones.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

kbc = pytest.importorskip("kael_backend_cpu")

import kael  # noqa: E402
from kael_backend_cpu._native import C  # noqa: E402


@pytest.fixture
def restore_threads() -> Iterator[None]:
    before = int(C.get_num_threads())
    yield
    C.set_num_threads(before)


@pytest.fixture(scope="module")
def native_serves_cpu() -> None:
    if kael.cpu.backend().name != "cpu":
        pytest.skip("kael_backend_cpu is not the selected cpu backend in this environment")


@pytest.fixture
def reference_serves_cpu() -> Iterator[None]:
    before = kael.backends.override("cpu")
    kael.backends.use("cpu", "reference")
    try:
        yield
    finally:
        kael.backends.use("cpu", before)


def _run(code: str, **env: str) -> str:
    res = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    return res.stdout.strip()


def test_kael_level_names_are_kael_cpu_functions() -> None:
    assert kael.set_num_threads is kael.cpu.set_num_threads
    assert kael.get_num_threads is kael.cpu.get_num_threads
    for name in (
        "set_num_threads",
        "get_num_threads",
        "memory_stats",
        "reset_peak_memory_stats",
        "empty_cache",
        "isa",
    ):
        assert name in kael.cpu.__all__ and name in kbc.__all__
        assert callable(getattr(kbc.CpuBackend, name))


@settings(max_examples=15, deadline=None)
@given(n=st.integers(1, 12), via=st.sampled_from(["kael", "kael.cpu", "kael_backend_cpu", "backend"]))
def test_every_spelling_sets_the_one_pool(native_serves_cpu: None, n: int, via: str) -> None:
    before = int(C.get_num_threads())
    try:
        setter = {
            "kael": kael.set_num_threads,
            "kael.cpu": kael.cpu.set_num_threads,
            "kael_backend_cpu": kbc.set_num_threads,
            "backend": kbc.CpuBackend().set_num_threads,
        }[via]
        setter(n)
        assert int(C.get_num_threads()) == n
        assert kael.get_num_threads() == kael.cpu.get_num_threads() == kbc.get_num_threads() == n
        assert kael.cpu.backend().get_num_threads() == n
    finally:
        C.set_num_threads(before)


@pytest.mark.parametrize("bad", [0, -1, True, False, 2.0, "2", None, [2]])
def test_bad_thread_counts_fail_alike_everywhere(restore_threads: Any, bad: Any) -> None:
    C.set_num_threads(2)
    for setter in (
        kael.cpu.set_num_threads,
        kael.set_num_threads,
        kbc.set_num_threads,
        kbc.CpuBackend().set_num_threads,
    ):
        with pytest.raises(
            kael.KaelError, match=rf"set_num_threads: expected an int >= 1.*, got {re.escape(repr(bad))}$"
        ):
            setter(bad)
    assert int(C.get_num_threads()) == 2


@pytest.mark.parametrize("too_many", [1025, 1 << 40])
def test_the_native_pool_has_a_limit(restore_threads: Any, too_many: int) -> None:
    C.set_num_threads(2)
    for setter in (kbc.set_num_threads, kbc.CpuBackend().set_num_threads):
        with pytest.raises(kael.KaelError, match=rf"expected an int >= 1 and <= 1024, got {too_many}"):
            setter(too_many)
    assert int(C.get_num_threads()) == 2
    assert kael.cpu.check_num_threads(too_many) == too_many  # the frontend itself sets no limit


def test_memory_controls_reach_the_native_allocator(native_serves_cpu: None) -> None:
    cpu = kael.cpu.backend()
    kael.cpu.empty_cache()
    before = kael.cpu.memory_stats()
    assert before == kbc.memory_stats() == dict(C.memory_stats())
    assert {"allocated_bytes", "peak_allocated_bytes", "cached_bytes", "num_allocs", "cache_hits"} <= set(before)
    block = cpu.allocate(5 << 20, None)
    during = kael.cpu.memory_stats()
    assert during["allocated_bytes"] - before["allocated_bytes"] >= 5 << 20
    assert during["num_allocs"] == before["num_allocs"] + 1
    del block
    kael.cpu.reset_peak_memory_stats()
    after = kbc.memory_stats()
    assert after["peak_allocated_bytes"] == after["allocated_bytes"] == before["allocated_bytes"]
    if after["caching"]:
        assert after["cached_bytes"] >= 5 << 20
    kael.cpu.empty_cache()
    assert kbc.memory_stats()["cached_bytes"] == 0


def test_isa_names_the_vector_table(native_serves_cpu: None) -> None:
    assert kael.cpu.isa() == kbc.isa() == kbc.CpuBackend().isa() == str(C.isa())
    assert kael.cpu.isa() in ("avx512", "avx2", "baseline")
    forced = {"base": "baseline"}.get(os.environ.get("KAEL_CPU_ISA", ""), os.environ.get("KAEL_CPU_ISA"))
    assert kael.cpu.isa() == (forced or C.isa_info()["runnable"][0])  # unforced: the widest this CPU runs
    for name in ("baseline", "base"):  # base: the old spelling of baseline
        assert _run("import kael, kael.cpu; print(kael.cpu.isa())", KAEL_CPU_ISA=name) == "baseline"


def test_reference_backend_has_no_pool_and_no_allocator(restore_threads: Any, reference_serves_cpu: None) -> None:
    C.set_num_threads(3)
    assert kael.cpu.backend().name == "reference"
    assert kael.cpu.get_num_threads() == kael.get_num_threads() == 1
    assert kael.cpu.memory_stats() == {}
    assert kael.cpu.isa() is None
    kael.cpu.set_num_threads(5)  # accepted, nothing to resize
    kael.cpu.reset_peak_memory_stats()
    kael.cpu.empty_cache()
    with pytest.raises(kael.KaelError, match="expected an int >= 1, got 0"):
        kael.set_num_threads(0)
    # kael_backend_cpu's own functions still reach the native pool
    assert kbc.get_num_threads() == 3
    kbc.set_num_threads(4)
    assert int(C.get_num_threads()) == 4
    assert "allocated_bytes" in kbc.memory_stats()


def test_environment_sets_the_default_through_kael_cpu() -> None:
    code = "import kael; print(kael.cpu.backend().name, kael.cpu.get_num_threads(), kael.get_num_threads())"
    name, n, m = _run(code, KAEL_NUM_THREADS="3").split()
    if name != "cpu":
        pytest.skip("kael_backend_cpu is not the selected cpu backend in this environment")
    assert n == m == "3"
    # out of range or not a number: the CPUs this process may run on
    cpus = str(len(os.sched_getaffinity(0))) if hasattr(os, "sched_getaffinity") else None
    for bad in ("0", "1025", "two"):
        got = _run("import kael; print(kael.cpu.get_num_threads())", KAEL_NUM_THREADS=bad)
        if cpus is not None:
            assert got == cpus, bad


@pytest.mark.parametrize("nbytes", [0, 1, 4097, (2 << 20) + 3, 9 << 20])
def test_huge_page_buffer_starts_on_a_2_mib_boundary(nbytes: int) -> None:
    buf = kael.cpu.huge_page_buffer(nbytes)
    assert buf.dtype == np.uint8 and buf.shape == (max(1, nbytes),) and buf.flags.writeable
    assert buf.ctypes.data % (2 << 20) == 0
    buf[...] = 7  # the whole extent is the caller's
    assert int(buf.sum()) == 7 * buf.size
