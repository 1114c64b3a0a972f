"""Thread control (set/get_num_threads, kael.set_num_threads) and kernels called from
several Python threads at once (the GIL is released while kernels run)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from typing import Any

import numpy as np
import pytest

kbc = pytest.importorskip("kael_backend_cpu")

from cpu_helpers import cpu_empty, logical  # noqa: E402
from kael import _dtype as dt  # noqa: E402
from kael._tensor import from_numpy_bits  # noqa: E402


@pytest.fixture
def restore_threads() -> Any:
    before = kbc.get_num_threads()
    yield
    kbc.set_num_threads(before)


def test_set_and_get(restore_threads: Any) -> None:
    for n in (1, 3, 2):
        kbc.set_num_threads(n)
        assert kbc.get_num_threads() == n
    with pytest.raises(Exception, match="expected an int >= 1"):
        kbc.set_num_threads(0)


def test_environment_sets_the_default() -> None:
    code = "import kael_backend_cpu as k; print(k.get_num_threads())"
    res = subprocess.run(
        [sys.executable, "-c", code],
        env=dict(os.environ, KAEL_NUM_THREADS="3"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "3"


def test_kael_level_thread_functions_reach_the_selected_backend(restore_threads: Any) -> None:
    import kael

    if kael.backends.current("cpu").name != "cpu":
        pytest.skip("kael_backend_cpu is not the selected cpu backend in this environment")
    kael.set_num_threads(2)
    assert kael.get_num_threads() == 2 == kbc.get_num_threads()


def test_kernels_from_many_python_threads(cpu: Any, restore_threads: Any) -> None:
    kbc.set_num_threads(2)
    rng = np.random.default_rng(0)
    mats = [rng.standard_normal((120, 150)).astype(np.float32) for _ in range(6)]
    want = [m.astype(np.float64) @ m.T.astype(np.float64) for m in mats]
    errors: list[str] = []

    def work(i: int) -> None:
        try:
            a = from_numpy_bits(mats[i], dt.float32)
            for _ in range(20):
                out = cpu_empty(cpu, (120, 120), dt.float32)
                cpu.kernel("matmul")(out, a, a.T)
                s = cpu_empty(cpu, (120, 1), dt.float32)
                cpu.kernel("sum")(s, out, (1,))
                if not np.allclose(logical(out), want[i], rtol=1e-4, atol=1e-3):
                    errors.append(f"thread {i}: wrong product")
                if not np.allclose(logical(s)[:, 0], want[i].sum(1), rtol=1e-4, atol=1e-2):
                    errors.append(f"thread {i}: wrong sum")
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(f"thread {i}: {exc!r}")

    threads = [threading.Thread(target=work, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def _child_sum(n: int) -> float:
    be = kbc.CpuBackend()
    x = from_numpy_bits(np.ones(n, np.float32), dt.float32)
    out = cpu_empty(be, (1,), dt.float32)
    be.kernel("sum")(out, x, (0,))  # big enough to use the pool
    return float(logical(out)[0])


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
def test_a_forked_child_gets_a_working_pool(cpu: Any, restore_threads: Any) -> None:
    import multiprocessing

    kbc.set_num_threads(2)
    assert _child_sum(1 << 20) == float(1 << 20)  # the parent's pool is up
    with multiprocessing.get_context("fork").Pool(1) as pool:
        assert pool.apply(_child_sum, (1 << 20,)) == float(1 << 20)
