"""Random numbers: manual_seed and Generator reproducibility, independence, and distribution sanity."""

from __future__ import annotations

import math

import kael
import numpy as np
import pytest


def test_manual_seed_reproduces_every_sampler() -> None:
    def draw() -> list[object]:
        return [
            kael.rand(5).tolist(),
            kael.randn(2, 3).tolist(),
            kael.randint(0, 10, (4,)).tolist(),
            kael.randperm(6).tolist(),
            kael.rand_like(kael.zeros(2, dtype=kael.float64)).tolist(),
        ]

    kael.manual_seed(1234)
    first = draw()
    kael.manual_seed(1234)
    assert draw() == first
    kael.manual_seed(4321)
    assert draw() != first


def test_generators_are_independent() -> None:
    g1, g2 = kael.Generator().manual_seed(7), kael.Generator().manual_seed(7)
    a = kael.randn(100, generator=g1)
    kael.randn(100)  # the default generator does not disturb g2
    b = kael.randn(100, generator=g2)
    assert a.tolist() == b.tolist()
    assert g1.initial_seed() == 7
    assert kael.randn(100, generator=g1).tolist() != a.tolist()  # the stream advances


def test_generator_state_round_trip() -> None:
    g = kael.Generator().manual_seed(3)
    kael.rand(10, generator=g)
    state = g.get_state()
    x = kael.rand(10, generator=g).tolist()
    g.set_state(state)
    assert kael.rand(10, generator=g).tolist() == x


def test_uniform_distribution() -> None:
    kael.manual_seed(0)
    n = 100_000
    u = np.asarray(kael.rand(n), dtype=np.float64)
    assert u.min() >= 0.0 and u.max() < 1.0
    assert abs(u.mean() - 0.5) < 5 / math.sqrt(12 * n)
    assert abs(u.var() - 1 / 12) < 2e-3
    hist, _ = np.histogram(u, bins=10, range=(0, 1))
    expected = n / 10
    chi2 = float(((hist - expected) ** 2 / expected).sum())
    assert chi2 < 30, f"uniform histogram far from flat (chi2 {chi2:.1f} with 9 dof)"


def test_normal_distribution() -> None:
    kael.manual_seed(0)
    n = 100_000
    z = np.asarray(kael.randn(n, dtype=kael.float64))
    assert abs(z.mean()) < 5 / math.sqrt(n)
    assert abs(z.std() - 1.0) < 0.01
    assert abs(np.mean(np.abs(z) < 1.0) - 0.6827) < 0.01  # the 68% rule
    assert abs(float(np.mean(z**3))) < 0.05  # symmetric


def test_randint_and_randperm() -> None:
    kael.manual_seed(0)
    r = np.asarray(kael.randint(-3, 4, (50_000,)))
    assert r.dtype == np.int64 and r.min() == -3 and r.max() == 3
    counts = np.bincount(r + 3)
    assert counts.min() > 50_000 / 7 * 0.9
    assert kael.randint(5, size=(3,)).tolist() != [] and kael.randint(2, 3, (4,)).tolist() == [2, 2, 2, 2]
    assert kael.randint(0, 10, (2,), dtype=kael.int32).dtype is kael.int32
    p = kael.randperm(20)
    assert sorted(p.tolist()) == list(range(20)) and p.dtype is kael.int64


def test_dtypes_shapes_and_grad() -> None:
    assert kael.rand(2, 3).dtype is kael.float32 and kael.rand(2, 3).shape == (2, 3)
    assert kael.randn((4,), dtype=kael.float16).dtype is kael.float16
    assert kael.rand(0).shape == (0,) and kael.randn(()).shape == ()
    b = kael.randn(3, dtype=kael.bfloat16)
    assert b.dtype is kael.bfloat16 and all(math.isfinite(v) for v in b.tolist())
    x = kael.randn(3, requires_grad=True)
    assert x.requires_grad and x.is_leaf
    assert kael.randn_like(x).shape == (3,) and not kael.randn_like(x).requires_grad


def test_bad_arguments() -> None:
    with pytest.raises(kael.DTypeError):
        kael.rand(2, dtype=kael.int64)
    with pytest.raises(kael.KaelError):
        kael.randint(5, 5, (2,))
    with pytest.raises(kael.DTypeError):
        kael.rand(2, generator=np.random.default_rng())
    with pytest.raises(kael.ShapeError):
        kael.randn(-1)
