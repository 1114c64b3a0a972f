"""The caching allocator seen from Python: numpy storage, statistics, reuse, and the
KAEL_NO_CACHING_ALLOCATOR=1 switch (checked in a subprocess: it is read once)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import numpy as np
import pytest

kbc = pytest.importorskip("kael_backend_cpu")


def test_storage_is_a_writable_aligned_uint8_array(cpu: Any) -> None:
    for n in (0, 1, 100, 5000, 1 << 20):
        a = cpu.allocate(n, None)
        assert isinstance(a, np.ndarray) and a.dtype == np.uint8 and a.shape == (n,)
        assert a.flags.c_contiguous and a.flags.writeable
        if n:
            assert a.ctypes.data % 64 == 0
            a[:] = 7
            assert int(a.sum()) == 7 * n


def test_statistics_follow_allocations(cpu: Any) -> None:
    kbc.empty_cache()
    before = kbc.memory_stats()
    block = cpu.allocate(3 << 20, None)
    during = kbc.memory_stats()
    assert during["allocated_bytes"] - before["allocated_bytes"] >= 3 << 20
    assert during["peak_allocated_bytes"] >= during["allocated_bytes"]
    assert during["num_allocs"] == before["num_allocs"] + 1
    del block
    after = kbc.memory_stats()
    assert after["allocated_bytes"] == before["allocated_bytes"]
    if after["caching"]:
        assert after["cached_bytes"] >= 3 << 20
    kbc.reset_peak_memory_stats()
    assert kbc.memory_stats()["peak_allocated_bytes"] == kbc.memory_stats()["allocated_bytes"]
    kbc.empty_cache()
    assert kbc.memory_stats()["cached_bytes"] == 0


def test_freed_blocks_are_reused(cpu: Any) -> None:
    if not kbc.memory_stats()["caching"]:
        pytest.skip("the caching allocator is off in this process")
    a = cpu.allocate(123_456, None)
    addr = a.ctypes.data
    del a
    hits = kbc.memory_stats()["cache_hits"]
    b = cpu.allocate(123_400, None)  # same size class
    assert b.ctypes.data == addr
    assert kbc.memory_stats()["cache_hits"] == hits + 1


def test_views_keep_the_block_alive(cpu: Any) -> None:
    a = cpu.allocate(4096, None)
    v = a[100:200].view(np.float32)
    v[:] = 1.5
    del a
    cpu.allocate(4096, None)  # would reuse the block if the view did not hold it
    assert np.all(v == 1.5)


def test_backend_memory_stats_are_ints(cpu: Any) -> None:
    stats = cpu.memory_stats()
    assert stats and all(isinstance(k, str) and isinstance(v, int) for k, v in stats.items())


_PROBE = """
import json, kael_backend_cpu as k
b = k.CpuBackend()
for _ in range(3):
    x = b.allocate(1 << 16, None); del x
print(json.dumps(k.memory_stats()))
"""


@pytest.mark.parametrize("flag,caching", [("1", False), ("0", True)])
def test_no_caching_switch(flag: str, caching: bool) -> None:
    env = dict(os.environ, KAEL_NO_CACHING_ALLOCATOR=flag)
    res = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    stats = json.loads(res.stdout.strip().splitlines()[-1])
    if not stats["caching"] and caching:
        pytest.skip("this build never caches (sanitizer build)")
    assert bool(stats["caching"]) is caching
    if caching:
        assert stats["cache_hits"] >= 2 and stats["cached_bytes"] >= 1 << 16
    else:
        assert stats["cache_hits"] == 0 and stats["cached_bytes"] == 0
        assert stats["system_allocs"] == stats["num_allocs"]
