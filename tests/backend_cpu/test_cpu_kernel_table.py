"""The C++ backend's kernel table (kael_backend_cpu/_kernels.py) against the op catalogue.

Every primitive is bound (the random kernels are kael.backends.host's), a fused op is
served exactly when the installed extension binds it, and the ops it serves from
kael.backends.host (random, float16 attention) are those host kernels. silu: the current
build must serve it natively once the extension has ``C.silu``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

kbc = pytest.importorskip("kael_backend_cpu")

import kael  # noqa: E402
from kael.backends import catalogue, host  # noqa: E402
from kael_backend_cpu._native import C  # noqa: E402

from kael_backend_cpu import _kernels  # noqa: E402


def test_every_primitive_is_served_and_bound_from_the_extension_or_the_host(cpu: Any) -> None:
    ops = cpu.supported_ops()
    assert catalogue.PRIMITIVES <= ops
    for op in catalogue.PRIMITIVES:
        k = cpu.kernel(op)
        assert k is host.RANDOM_KERNELS[op] if op in host.RANDOM_KERNELS else k is getattr(C, op), op


def test_fused_ops_are_served_exactly_when_the_extension_binds_them(cpu: Any) -> None:
    served = cpu.supported_ops() & catalogue.FUSED
    assert served == {op for op in catalogue.FUSED if hasattr(C, op)}
    assert _kernels.missing_fused() == sorted(catalogue.FUSED - served)
    assert set(cpu.supported_ops()) <= set(catalogue.CATALOGUE)


def test_silu_is_native_once_the_extension_has_it(cpu: Any) -> None:
    if not hasattr(C, "silu"):
        pytest.skip(
            "the installed kael_backend_cpu._C has no silu (built before the C++ kernel was added); "
            "reinstall kael_backend_cpu to build it"
        )
    assert "silu" in cpu.supported_ops() and cpu.kernel("silu") is C.silu
    torch = pytest.importorskip("torch")
    x = np.random.default_rng(0).standard_normal((33, 17)).astype(np.float32) * 6
    t = kael.tensor(x).T
    out = kael.empty(t.shape)
    cpu.kernel("silu")(out, t)
    np.testing.assert_allclose(out.numpy(), torch.nn.functional.silu(torch.tensor(x).T).numpy(), rtol=2e-6, atol=1e-7)


def test_float16_attention_runs_the_host_kernel(cpu: Any, ref: Any) -> None:
    rng = np.random.default_rng(1)
    q, k, v = (kael.tensor(rng.standard_normal((1, 2, 3, 4)), dtype=kael.float16) for _ in range(3))
    got, want = kael.empty(1, 2, 3, 4, dtype=kael.float16), kael.empty(1, 2, 3, 4, dtype=kael.float16)
    cpu.kernel("attention")(got, q, k, v, 0.5, True, None)
    ref.kernel("attention")(want, q, k, v, 0.5, True, None)
    np.testing.assert_array_equal(got.numpy(), want.numpy())  # the same NumPy arithmetic, bit for bit
