"""``kael.paged_attention``: causal attention over a paged KV cache, against an independent oracle.

* The oracle is written here in float64 NumPy, one (row, head, query) at a time: walk the
  row's positions through its block table, take the keys up to the query's position, and
  softmax. Cases: grouped-query and multi-query heads, decode (T = 1) and prefill after
  cached positions (T > 1), rows of different lengths, shuffled block ids with junk past
  the used entries, block sizes 1, 3 and 16, strided q / cache / block table views, every
  float dtype. Hypothesis varies shapes, lengths and block placement.
* Bit-identity: a row batched with others gives the bits it gives alone, and the same keys
  in other blocks (of another pool) give the same bits; the reference kernel gives exactly
  the reference ``attention``'s bits on the gathered keys, and the decomposition exactly
  what ``attention`` gives on them.
* Every mode: the CPU backend as installed, the reference backend's fused host kernels, and
  a backend without fused kernels (the decomposition).
* Bad input: a ``kael.KaelError`` subclass naming ``paged_attention`` and the value.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import kael
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kael.backends.reference import ReferenceBackend

MODES = ["default", "reference", "decomposition"]


@contextmanager
def _use(backend: Any, tag: str) -> Iterator[None]:
    class Plugin:
        @kael.hookimpl
        def kael_backends(self) -> list[Any]:
            return [backend]

    kael.backends.register(Plugin(), tag)
    kael.backends.use("cpu", backend.name)
    try:
        yield
    finally:
        kael.backends.use("cpu", None)
        kael.backends.unregister(tag)


@pytest.fixture(params=MODES)
def mode(request: pytest.FixtureRequest) -> Iterator[str]:
    """The CPU backend as installed, the reference backend (fused host kernels), and one without fused kernels."""
    if request.param == "default":
        yield request.param
        return
    backend = ReferenceBackend(fused=request.param == "reference")
    backend.name = f"paged_attention_{request.param}"
    backend.priority = -1
    with _use(backend, f"test_paged_attention_{request.param}"):
        yield request.param


# -- the float64 oracle, written independently of kael ---------------------------------------------


def oracle(q: np.ndarray, cache: np.ndarray, table: np.ndarray, lengths: np.ndarray, scale: float) -> np.ndarray:
    """out [B, H, T, D] in float64: each query against the keys of its row up to its own position."""
    b, h, t, d = q.shape
    hkv, s = cache.shape[2], cache.shape[3]
    out = np.zeros((b, h, t, d))
    for r in range(b):
        n = int(lengths[r])
        keys = np.stack([cache[table[r, p // s], 0, :, p % s] for p in range(n)], axis=1)  # [Hkv, n, D]
        values = np.stack([cache[table[r, p // s], 1, :, p % s] for p in range(n)], axis=1)
        for head in range(h):
            j = head // (h // hkv)
            for i in range(t):
                last = n - t + i  # the query's own position: it sees keys 0..last
                z = keys[j, : last + 1].astype(np.float64) @ q[r, head, i].astype(np.float64) * scale
                w = np.exp(z - z.max())
                out[r, head, i] = (w / w.sum()) @ values[j, : last + 1].astype(np.float64)
    return out


def make_case(
    rng: np.random.Generator,
    b: int,
    h: int,
    hkv: int,
    t: int,
    d: int,
    s: int,
    lengths: list[int],
    spare: int = 3,
    m: int | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(q, cache, block_table, lengths): each row's blocks at shuffled distinct ids, junk past the used entries."""
    need = [-(-n // s) for n in lengths]
    m = max([*need, 1]) if m is None else m
    nb = sum(need) + spare
    ids = rng.permutation(nb)
    table = np.full((b, m), -1, np.int64)
    at = 0
    for r, k in enumerate(need):
        table[r, :k] = ids[at : at + k]
        table[r, k:] = rng.choice([-1, nb + 5, 0], size=m - k)  # ignored entries hold anything
        at += k
    q = rng.standard_normal((b, h, t, d))
    cache = rng.standard_normal((nb, 2, hkv, s, d))
    return q, cache, table, np.array(lengths, np.int64)


def _run(
    q: np.ndarray, cache: np.ndarray, table: np.ndarray, lengths: np.ndarray, dtype: Any = kael.float32, **kw: Any
):
    return kael.paged_attention(
        kael.tensor(q, dtype=dtype), kael.tensor(cache, dtype=dtype), kael.tensor(table), kael.tensor(lengths), **kw
    )


def _f64(t: kael.Tensor) -> np.ndarray:
    return np.asarray(t.to(dtype=kael.float64) if t.dtype.itemsize == 2 else t, dtype=np.float64)


TOL = {"float64": 1e-12, "float32": 2e-5, "float16": 1e-2, "bfloat16": 6e-2}

SHAPES = {
    # name: (B, H, Hkv, T, D, S, lengths)
    "decode": (3, 4, 4, 1, 8, 4, [5, 1, 12]),
    "prefill_after_cache": (2, 4, 2, 5, 8, 3, [9, 5]),
    "gqa_decode": (2, 6, 2, 1, 4, 16, [17, 40]),
    "mqa_prefill": (2, 4, 1, 3, 6, 16, [3, 20]),
    "block_size_1": (2, 2, 2, 2, 5, 1, [7, 2]),
    "block_size_3_exact_fill": (3, 2, 1, 3, 4, 3, [6, 3, 9]),
    "one_row": (1, 3, 3, 4, 8, 16, [4]),
}


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_matches_the_float64_oracle(mode: str, name: str, rng: np.random.Generator) -> None:
    b, h, hkv, t, d, s, lengths = SHAPES[name]
    q, cache, table, lens = make_case(rng, b, h, hkv, t, d, s, lengths)
    want = oracle(q, cache, table, lens, 1 / np.sqrt(d))
    for dtype in (kael.float64, kael.float32):
        out = _run(q, cache, table, lens, dtype)
        assert out.shape == (b, h, t, d) and out.dtype is dtype
        np.testing.assert_allclose(_f64(out), want, rtol=TOL[dtype.name], atol=TOL[dtype.name])


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_dtypes(mode: str, dtype: str, rng: np.random.Generator) -> None:
    d = getattr(kael, dtype)
    q, cache, table, lens = make_case(rng, 2, 4, 2, 2, 8, 4, [6, 11])
    qh, ch = (np.asarray(kael.tensor(a, dtype=d).to(dtype=kael.float64)) for a in (q, cache))
    out = _run(q, cache, table, lens, d)
    assert out.dtype is d
    np.testing.assert_allclose(_f64(out), oracle(qh, ch, table, lens, 1 / np.sqrt(8)), rtol=TOL[dtype], atol=TOL[dtype])


def test_explicit_scale_and_narrower_index_dtypes(mode: str, rng: np.random.Generator) -> None:
    q, cache, table, lens = make_case(rng, 2, 2, 2, 2, 4, 3, [4, 8])
    out = kael.paged_attention(
        kael.tensor(q),
        kael.tensor(cache),
        kael.tensor(table.astype(np.int32)),
        kael.tensor(lens.astype(np.int16)),
        scale=0.3,
    )
    np.testing.assert_allclose(out.numpy(), oracle(q, cache, table, lens, 0.3), rtol=2e-5, atol=2e-5)


def test_strided_views(mode: str, rng: np.random.Generator) -> None:
    b, h, hkv, t, d, s = 2, 4, 2, 3, 6, 3
    q, cache, table, lens = make_case(rng, b, h, hkv, t, d, s, [7, 4])
    want = oracle(q, cache, table, lens, 1 / np.sqrt(d))
    # q viewed [B, H, T, D] from [B, T, H, D] storage (as heads are split from a projection)
    qv = kael.tensor(np.ascontiguousarray(q.transpose(0, 2, 1, 3))).permute(0, 2, 1, 3)
    # the pool every other block of a bigger one, with the last dim strided too
    big = np.zeros((2 * cache.shape[0], 2, hkv, s, 2 * d))
    big[::2, ..., ::2] = cache
    cv = kael.tensor(big)[::2, :, :, :, ::2]
    # the block table a transposed view
    tv = kael.tensor(np.ascontiguousarray(table.T)).T
    assert not (qv.is_contiguous() or cv.is_contiguous() or tv.is_contiguous())
    out = kael.paged_attention(qv, cv, tv, kael.tensor(lens))
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-12, atol=1e-12)


def test_a_row_batched_gives_the_bits_it_gives_alone(mode: str, rng: np.random.Generator) -> None:
    for dtype in (kael.float32, kael.bfloat16):
        q, cache, table, lens = make_case(rng, 3, 4, 2, 2, 8, 4, [9, 2, 16])
        batched = _run(q, cache, table, lens, dtype)
        for r in range(3):
            alone = _run(q[r : r + 1], cache, table[r : r + 1], lens[r : r + 1], dtype)
            assert np.array_equal(
                np.asarray(batched[r : r + 1].to(dtype=kael.float32)), np.asarray(alone.to(dtype=kael.float32))
            )


def test_the_same_keys_in_other_blocks_give_the_same_bits(mode: str, rng: np.random.Generator) -> None:
    q, cache, table, lens = make_case(rng, 2, 4, 4, 1, 8, 3, [7, 5])
    here = _run(q, cache, table, lens)
    # move every block to another id of a bigger pool (reversed order, junk in between)
    nb = cache.shape[0]
    moved = rng.standard_normal((3 * nb, *cache.shape[1:]))
    new_id = 3 * nb - 1 - 3 * np.arange(nb)
    moved[new_id] = cache
    table2 = np.where((table >= 0) & (table < nb), new_id[np.clip(table, 0, nb - 1)], -1)
    there = _run(q, moved, table2, lens)
    assert np.array_equal(here.numpy(), there.numpy())


def _gathered(cache: np.ndarray, table: np.ndarray, n: int, part: int) -> np.ndarray:
    s = cache.shape[3]
    return np.stack([cache[table[p // s], part, :, p % s] for p in range(n)], axis=1)[None]  # [1, Hkv, n, D]


@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16", "float16"])
def test_bits_equal_attention_on_the_gathered_keys(mode: str, dtype: str, rng: np.random.Generator) -> None:
    """Reference kernel vs reference attention, decomposition vs attention: the same bits, row by row."""
    d = getattr(kael, dtype)
    q, cache, table, lens = make_case(rng, 3, 6, 2, 3, 8, 4, [3, 10, 7])
    out = _run(q, cache, table, lens, d, scale=0.25)
    for r in range(3):
        k, v = (_gathered(cache, table[r], int(lens[r]), i) for i in (0, 1))
        want = kael.attention(
            kael.tensor(q[r : r + 1], dtype=d),
            kael.tensor(k, dtype=d),
            kael.tensor(v, dtype=d),
            causal=True,
            scale=0.25,
        )
        got = out[r : r + 1]
        assert np.array_equal(np.asarray(got.to(dtype=kael.float64)), np.asarray(want.to(dtype=kael.float64))), r


def test_no_autograd_even_when_q_requires_grad(rng: np.random.Generator) -> None:
    q, cache, table, lens = make_case(rng, 1, 2, 2, 1, 4, 4, [3])
    qt = kael.tensor(q).requires_grad_(True)
    out = kael.paged_attention(qt, kael.tensor(cache), kael.tensor(table), kael.tensor(lens))
    assert out.grad_fn is None and not out.requires_grad


def test_empty_batch_and_no_queries(mode: str) -> None:
    out = kael.paged_attention(
        kael.zeros(0, 2, 1, 4),
        kael.zeros(3, 2, 2, 4, 4),
        kael.zeros(0, 2, dtype=kael.int64),
        kael.zeros(0, dtype=kael.int64),
    )
    assert out.shape == (0, 2, 1, 4)
    out = kael.paged_attention(
        kael.zeros(2, 2, 0, 4),
        kael.zeros(0, 2, 2, 4, 4),
        kael.zeros(2, 0, dtype=kael.int64),
        kael.zeros(2, dtype=kael.int64),
    )
    assert out.shape == (2, 2, 0, 4)


def test_exported_and_in_the_catalogue() -> None:
    from kael.backends import catalogue

    assert kael.paged_attention is kael.ops.paged_attention
    d = catalogue.op("paged_attention")
    assert (
        d.kind == "fused"
        and d.signature == "paged_attention(out, q, cache, block_table, lengths, scale: float, window: int)"
    )
    assert catalogue.decomposition("paged_attention") is not None


# -- hypothesis ----------------------------------------------------------------------------------


@st.composite
def paged_cases(draw: Any) -> tuple[Any, ...]:
    hkv = draw(st.integers(1, 3))
    h = hkv * draw(st.integers(1, 3))
    b = draw(st.integers(1, 4))
    t = draw(st.integers(1, 4))
    d = draw(st.integers(1, 6))
    s = draw(st.sampled_from([1, 2, 3, 5, 16]))
    lengths = [draw(st.integers(t, t + 20)) for _ in range(b)]
    extra = draw(st.integers(0, 2))  # block-table columns beyond what the longest row needs
    seed = draw(st.integers(0, 2**32 - 1))
    return b, h, hkv, t, d, s, lengths, extra, seed


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=paged_cases())
def test_property_matches_the_oracle(case: tuple[Any, ...]) -> None:
    b, h, hkv, t, d, s, lengths, extra, seed = case
    rng = np.random.default_rng(seed)
    m = max(-(-n // s) for n in lengths) + extra
    q, cache, table, lens = make_case(rng, b, h, hkv, t, d, s, lengths, spare=int(rng.integers(0, 4)), m=m)
    want = oracle(q, cache, table, lens, 1 / np.sqrt(d))
    ref = ReferenceBackend(fused=True)
    ref.name, ref.priority = "paged_attention_property", -1
    got_default = _run(q, cache, table, lens, kael.float64)
    np.testing.assert_allclose(got_default.numpy(), want, rtol=1e-11, atol=1e-12)
    with _use(ref, "test_paged_attention_property"):
        got = _run(q, cache, table, lens, kael.float64)
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-11, atol=1e-12)
        alone = _run(q[-1:], cache, table[-1:], lens[-1:], kael.float64)
        assert np.array_equal(got.numpy()[-1:], alone.numpy())


# -- bad input -------------------------------------------------------------------------------------


def _ok() -> dict[str, Any]:
    rng = np.random.default_rng(0)
    q, cache, table, lens = make_case(rng, 2, 4, 2, 2, 4, 4, [5, 3], m=3)
    return {
        "q": kael.tensor(q, dtype=kael.float32),
        "cache": kael.tensor(cache, dtype=kael.float32),
        "block_table": kael.tensor(table),
        "lengths": kael.tensor(lens),
    }


def _with(**kw: Any) -> dict[str, Any]:
    a = _ok()
    a.update(kw)
    return a


BAD: list[tuple[str, Any, type, str]] = [
    ("q not a tensor", lambda: _with(q=np.zeros((2, 4, 2, 4))), kael.DTypeError, r"paged_attention: q.*tensor"),
    ("q integer", lambda: _with(q=kael.zeros(2, 4, 2, 4, dtype=kael.int64)), kael.DTypeError, "floating-point"),
    ("q rank", lambda: _with(q=kael.zeros(4, 2, 4)), kael.ShapeError, r"q must be \[B, H, T, D\].*\[4, 2, 4\]"),
    ("cache rank", lambda: _with(cache=kael.zeros(5, 2, 4, 4)), kael.ShapeError, r"cache must be.*\[5, 2, 4, 4\]"),
    ("cache not k/v", lambda: _with(cache=kael.zeros(5, 3, 2, 4, 4)), kael.ShapeError, r"\[5, 3, 2, 4, 4\]"),
    ("cache head dim", lambda: _with(cache=kael.zeros(5, 2, 2, 4, 8)), kael.ShapeError, "q's D = 4"),
    ("cache no kv heads", lambda: _with(cache=kael.zeros(5, 2, 0, 4, 4)), kael.ShapeError, "Hkv >= 1"),
    ("cache block size 0", lambda: _with(cache=kael.zeros(5, 2, 2, 0, 4)), kael.ShapeError, "S >= 1"),
    (
        "cache dtype",
        lambda: _with(cache=kael.zeros(5, 2, 2, 4, 4, dtype=kael.float64)),
        kael.DTypeError,
        "cache must have q's dtype",
    ),
    ("heads", lambda: _with(cache=kael.zeros(5, 2, 3, 4, 4)), kael.ShapeError, r"4 query heads.*3 key/value heads"),
    (
        "table dtype",
        lambda: _with(block_table=kael.zeros(2, 3)),
        kael.DTypeError,
        "block_table must be an int64 tensor",
    ),
    ("table rank", lambda: _with(block_table=kael.zeros(6, dtype=kael.int64)), kael.ShapeError, r"block_table.*\[6\]"),
    (
        "table rows",
        lambda: _with(block_table=kael.zeros(3, 3, dtype=kael.int64)),
        kael.ShapeError,
        r"block_table must be \[B, M\] = \[2, M\]",
    ),
    ("lengths dtype", lambda: _with(lengths=kael.tensor([5.0, 3.0])), kael.DTypeError, "lengths must be an int64"),
    ("lengths shape", lambda: _with(lengths=kael.tensor([5, 3, 1])), kael.ShapeError, r"lengths must be \[B\] = \[2\]"),
    (
        "lengths below T",
        lambda: _with(lengths=kael.tensor([5, 1])),
        kael.ShapeError,
        r"lengths\[1\] = 1 is out of range.*2 <= 1 <= 3\*4 = 12",
    ),
    ("lengths above M*S", lambda: _with(lengths=kael.tensor([13, 3])), kael.ShapeError, r"lengths\[0\] = 13.*= 12"),
    (
        "negative block id in use",
        lambda: _with(block_table=kael.tensor([[0, 1, 2], [-1, 4, 4]])),
        kael.IndexError_,
        r"block_table\[1, 0\] = -1 is not a block of the cache's",
    ),
    (
        "block id past the pool",
        lambda: _with(block_table=kael.tensor([[0, 99, 2], [3, 4, 4]])),
        kael.IndexError_,
        r"block_table\[0, 1\] = 99",
    ),
]


@pytest.mark.parametrize("name,args,exc,match", BAD, ids=[b[0] for b in BAD])
def test_bad_input_is_a_clear_error(name: str, args: Any, exc: type, match: str) -> None:
    with pytest.raises(exc, match=match) as info:
        kael.paged_attention(**args())
    assert isinstance(info.value, kael.KaelError) and "paged_attention" in str(info.value)


def test_ignored_table_entries_may_hold_anything(rng: np.random.Generator) -> None:
    a = _ok()
    t = a["block_table"].numpy().copy()
    t[:, 2] = [-7, 10**9]  # past ceil(5/4) = 2 and ceil(3/4) = 1 used entries
    t[1, 1] = -1
    out = kael.paged_attention(a["q"], a["cache"], kael.tensor(t), a["lengths"])
    want = oracle(a["q"].numpy(), a["cache"].numpy(), t, a["lengths"].numpy(), 0.5)
    np.testing.assert_allclose(out.numpy(), want, rtol=2e-5, atol=2e-5)


class _FakeDevice(ReferenceBackend):
    """The reference kernels serving a second device type, to mix devices."""

    name = "paged-attention-fake-device"
    device_type = "pagedfakedev"


def test_mixed_devices_are_a_device_error() -> None:
    class Plugin:
        @kael.hookimpl
        def kael_backends(self) -> list[Any]:
            return [_FakeDevice()]

    kael.backends.register(Plugin(), "test-paged-fakedev")
    try:
        a = _ok()
        with pytest.raises(kael.DeviceError, match="paged_attention"):
            kael.paged_attention(a["q"], a["cache"].to("pagedfakedev"), a["block_table"], a["lengths"])
        with pytest.raises(kael.DeviceError, match="paged_attention"):
            kael.paged_attention(a["q"], a["cache"], a["block_table"], a["lengths"].to("pagedfakedev"))
    finally:
        kael.backends.unregister("test-paged-fakedev")
