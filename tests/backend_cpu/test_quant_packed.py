"""Repacked Q8_0 / Q4_0 / IQ4_NL / Q4_K / Q6_K weights (NOTE [repacked rows] in csrc/vec_quant_packed.h, NOTE [repacked weights] in
kael_backend_cpu/_repack.py): the layout, the kernel and the copies the kernel table keeps.

Oracles: a NumPy statement of the layout (16 rows interleaved block by block: the rows' float16 scales, then
4-byte chunks row by row; Q8_0's integers as q + 128; IQ4_NL's nibbles as Q4_0's; Q5_0's fifth bits in a vector of
their own (bit 2c of byte i: value 4c + i's, bit 2c + 1: value 16 + 4c + i's) before Q4_0-like nibbles; Q4_K's d, dmin, scale bytes, then nibbles of values i
and 128 + i; Q6_K's six-bit integers decoded by ggml's dequantizer's rules, in nibble and two-bit vectors); the integer path's NumPy models (test_quant_int8.model: NOTE [integer dot
order]; test_quant_int8_k.model: NOTE [integer K dot order]), which the repacked rows must meet bit for bit, as
GGML's rows do.
"""

from __future__ import annotations

from typing import Any

import kael
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

kbc = pytest.importorskip("kael_backend_cpu")
pytest.importorskip("gguf")

from _quant_helpers import F32, SETTINGS, assert_bits  # noqa: E402
from cpu_helpers import cpu_empty, logical  # noqa: E402
from kael import _dtype as dt  # noqa: E402
from kael._tensor import from_numpy_bits  # noqa: E402
from kael_backend_cpu._native import C  # noqa: E402
from test_quant_int8 import encode, model  # noqa: E402
from test_quant_int8_k import model as k_model  # noqa: E402
from test_quant_int8_k import weights as k_weights  # noqa: E402

from kael_backend_cpu import _repack  # noqa: E402

SCHEMES = ("q8_0", "q4_0", "iq4_nl", "q5_0", "q4_k", "q6_k")
BLOCK_BYTES = {"q8_0": 34, "q4_0": 18, "iq4_nl": 18, "q5_0": 22, "q4_k": 144, "q6_k": 210}
SUPER = ("q4_k", "q6_k")  # 256-value super-blocks: Q8_K activations
needs_kernel = pytest.mark.skipif(
    not all(C.packable(s) for s in SCHEMES), reason="this CPU's table has no kernel for repacked rows (AVX512_VNNI)"
)


def q6k_ints(blocks: np.ndarray) -> np.ndarray:
    """Q6_K super-blocks [.., 210] -> their 256 integers u = q + 32 each, in value order (ggml's
    dequantize_row_q6_K: per half h, value 128 h + 32 t + l has ql[64 h + l + 32 (t % 2)]'s low (t < 2) or high
    nibble and bits 2t, 2t + 1 of qh[32 h + l])."""
    ql, qh = blocks[..., :128].astype(np.int64), blocks[..., 128:192].astype(np.int64)
    u = np.zeros((*blocks.shape[:-1], 256), np.int64)
    for h in range(2):
        for t in range(4):
            lo = ql[..., 64 * h + 32 * (t % 2) : 64 * h + 32 * (t % 2) + 32]
            nib = lo >> 4 if t >= 2 else lo & 15
            u[..., 128 * h + 32 * t : 128 * h + 32 * t + 32] = nib | (
                ((qh[..., 32 * h : 32 * h + 32] >> (2 * t)) & 3) << 4
            )
    return u


def q6k_layout(slab: np.ndarray) -> np.ndarray:
    """One slab's super-blocks [16, nb, 210] in NOTE [repacked rows]' Q6_K layout [nb, 3360]."""
    nb = slab.shape[1]
    u = q6k_ints(slab).reshape(16, nb, 16, 4, 4)  # row, block, group, quarter, value
    out = np.zeros((nb, 3360), np.uint8)
    out[:, :32] = slab[:, :, 208:210].transpose(1, 0, 2).reshape(nb, 32)
    out[:, 32:288] = slab[:, :, 192:208].transpose(1, 2, 0).reshape(nb, 256)
    vec = np.zeros((nb, 16, 3, 16, 4), np.int64)  # block, group, vector, row, value
    u = u.transpose(1, 2, 3, 0, 4)  # block, group, quarter, row, value
    vec[:, :, 0] = (u[:, :, 0] & 15) | ((u[:, :, 1] & 15) << 4)
    vec[:, :, 1] = (u[:, :, 2] & 15) | ((u[:, :, 3] & 15) << 4)
    vec[:, :, 2] = (u[:, :, 0] >> 4) | ((u[:, :, 1] >> 4) << 2) | ((u[:, :, 2] >> 4) << 4) | ((u[:, :, 3] >> 4) << 6)
    out[:, 288:] = vec.reshape(nb, 3072)
    return out


def q4k_layout(slab: np.ndarray) -> np.ndarray:
    """One slab's Q4_K super-blocks [16, nb, 144] in the repacked layout [nb, 2304]."""
    nb = slab.shape[1]
    qs = slab[..., 16:].astype(np.int64).reshape(16, nb, 4, 32)
    u = np.stack([qs & 15, qs >> 4], axis=3).reshape(16, nb, 256)  # value 64 j + 32 h + l
    out = np.zeros((nb, 2304), np.uint8)
    out[:, :32] = slab[..., 0:2].transpose(1, 0, 2).reshape(nb, 32)
    out[:, 32:64] = slab[..., 2:4].transpose(1, 0, 2).reshape(nb, 32)
    out[:, 64:256] = slab[..., 4:16].transpose(1, 2, 0).reshape(nb, 192)
    vec = u[..., :128] | (u[..., 128:] << 4)  # [row, block, 128]: vector i, value e at 4 i + e
    out[:, 256:] = vec.reshape(16, nb, 32, 4).transpose(1, 2, 0, 3).reshape(nb, 2048)
    return out


def layout(data: np.ndarray, scheme: str) -> np.ndarray:
    """NOTE [repacked rows]' layout of GGML rows `data` [n, row bytes], from its statement."""
    n, width = data.shape
    b = BLOCK_BYTES[scheme]
    if scheme in SUPER:
        slab_layout = q6k_layout if scheme == "q6_k" else q4k_layout
        out = data.copy()
        for s in range(n // 16):
            out[16 * s : 16 * s + 16] = slab_layout(data[16 * s : 16 * s + 16].reshape(16, -1, b)).reshape(16, width)
        return out
    nb, chunks = width // b, (b - 2) // 4
    out = data.copy()
    if scheme == "q5_0":
        for s in range(n // 16):
            blocks = data[16 * s : 16 * s + 16].reshape(16, nb, b)
            slab = np.zeros((nb, 352), np.uint8)
            slab[:, :32] = blocks[:, :, :2].transpose(1, 0, 2).reshape(nb, 32)
            qh = blocks[:, :, 2:6].copy().view("<u4")[..., 0].astype(np.int64)  # [row, block]: bit j, value j's
            bits = np.zeros((16, nb, 4), np.int64)
            for i in range(4):
                for c in range(4):
                    bits[..., i] |= ((qh >> (4 * c + i)) & 1) << (2 * c)
                    bits[..., i] |= ((qh >> (16 + 4 * c + i)) & 1) << (2 * c + 1)
            slab[:, 32:96] = bits.astype(np.uint8).transpose(1, 0, 2).reshape(nb, 64)
            slab[:, 96:] = blocks[:, :, 6:].reshape(16, nb, 4, 4).transpose(1, 2, 0, 3).reshape(nb, 256)
            out[16 * s : 16 * s + 16] = slab.reshape(16, width)
        return out
    for s in range(n // 16):
        blocks = data[16 * s : 16 * s + 16].reshape(16, nb, b)
        slab = np.zeros((nb, 32 + 64 * chunks), np.uint8)
        slab[:, :32] = blocks[:, :, :2].transpose(1, 0, 2).reshape(nb, 32)
        ints = blocks[:, :, 2:] ^ (0x80 if scheme == "q8_0" else 0)  # [row, block, byte]
        slab[:, 32:] = ints.reshape(16, nb, chunks, 4).transpose(1, 2, 0, 3).reshape(nb, 64 * chunks)
        out[16 * s : 16 * s + 16] = slab.reshape(16, width)
    return out


def pack(cpu: Any, data: np.ndarray, scheme: str) -> tuple[Any, Any]:
    w = from_numpy_bits(data, dt.uint8)
    packed = cpu_empty(cpu, data.shape, dt.uint8)
    C.pack_quantized(packed, w, scheme)
    return w, packed


def run_packed(cpu: Any, x: np.ndarray, w: Any, packed: Any, bias: np.ndarray | None, scheme: str) -> np.ndarray:
    out = cpu_empty(cpu, (x.shape[0], w.shape[0]), dt.float32)
    b = None if bias is None else from_numpy_bits(bias.astype(F32), dt.float32)
    C.quantized_linear(out, from_numpy_bits(x.astype(F32), dt.float32), w, b, scheme, packed)
    return logical(out)


@pytest.fixture(autouse=True)
def _integer_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KAEL_QUANT_ACTIVATIONS", "auto")
    monkeypatch.delenv("KAEL_REPACK", raising=False)


@needs_kernel
@pytest.mark.parametrize("scheme", SCHEMES)
def test_layout(cpu: Any, scheme: str) -> None:
    """pack_quantized writes the stated layout: whole slabs interleaved, the rows after them as they were."""
    rng = np.random.default_rng(0)
    for n, nb in ((16, 1), (37, 3), (50, 4 if scheme in SUPER else 24)):
        data = rng.integers(0, 256, (n, nb * BLOCK_BYTES[scheme]), dtype=np.uint8)
        _, packed = pack(cpu, data, scheme)
        np.testing.assert_array_equal(logical(packed), layout(data, scheme))


@needs_kernel
@SETTINGS
@given(
    scheme=st.sampled_from(SCHEMES[:4]),
    m=st.integers(1, 16),
    nb=st.integers(1, 40),
    n=st.integers(16, 70),
    with_bias=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
)
def test_bit_identical_to_the_model(cpu: Any, scheme: str, m: int, nb: int, n: int, with_bias: bool, seed: int) -> None:
    """Any row count up to 16, block count (every tail of the groups of eight blocks) and N (whole slabs and the
    rows after them): the integer path's model, bit for bit."""
    rng = np.random.default_rng(seed)
    k = 32 * nb
    x = rng.standard_normal((m, k)).astype(F32)
    data = encode(rng.standard_normal((n, k)), scheme)
    bias = rng.standard_normal(n).astype(F32) if with_bias else None
    w, packed = pack(cpu, data, scheme)
    assert_bits(run_packed(cpu, x, w, packed, bias, scheme), model(x, data, bias, scheme))


@needs_kernel
@SETTINGS
@given(
    scheme=st.sampled_from(SUPER),
    m=st.integers(1, 16),
    nb=st.integers(1, 4),
    n=st.integers(16, 40),
    with_bias=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
)
def test_super_blocks_bit_identical_to_the_model(
    cpu: Any, scheme: str, m: int, nb: int, n: int, with_bias: bool, seed: int
) -> None:
    """Q4_K and Q6_K (Q8_K activations): NOTE [integer K dot order]'s model, bit for bit."""
    rng = np.random.default_rng(seed)
    k = 256 * nb
    x = rng.standard_normal((m, k)).astype(F32)
    data = k_weights(rng, n, k, scheme)
    bias = rng.standard_normal(n).astype(F32) if with_bias else None
    w, packed = pack(cpu, data, scheme)
    assert_bits(run_packed(cpu, x, w, packed, bias, scheme), k_model(x, data, bias, scheme))


@needs_kernel
@pytest.mark.parametrize("scheme", SCHEMES)
def test_extreme_integers_batched_equal_alone_and_threads_agree(cpu: Any, scheme: str) -> None:
    """Random weight bytes (q8_0's -128 and 127, nibbles 0 and 15, every six-bit scale and min of q4_k, every
    six-bit integer and int8 scale of q6_k)
    with finite scales; 16 rows batched equal each row alone, at 1 and 2 threads, and the model."""
    rng = np.random.default_rng(1)
    n, nb, values = (301, 3, 256) if scheme in SUPER else (301, 24, 32)
    blocks = rng.integers(0, 256, (n, nb, BLOCK_BYTES[scheme]), dtype=np.uint8)
    for at in {"q6_k": (208,), "q4_k": (0, 2)}.get(scheme, (0,)):  # the float16 scales: finite
        blocks[..., at : at + 2] = rng.uniform(-2, 2, (n, nb, 1)).astype(np.float16).view(np.uint8)
    data = blocks.reshape(n, -1)
    x = rng.standard_normal((16, values * nb)).astype(F32)
    oracle = k_model if scheme in SUPER else model
    w, packed = pack(cpu, data, scheme)
    before = kbc.get_num_threads()
    try:
        for threads in (1, 2):
            kbc.set_num_threads(threads)
            batched = run_packed(cpu, x, w, packed, None, scheme)
            assert_bits(batched, oracle(x, data, None, scheme))
            for i in (0, 7, 15):
                assert_bits(run_packed(cpu, x[i : i + 1], w, packed, None, scheme)[0], batched[i])
    finally:
        kbc.set_num_threads(before)


@needs_kernel
def test_more_rows_and_the_float_path_ignore_the_copy(cpu: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """17 rows (a prompt) and KAEL_QUANT_ACTIVATIONS=f32 read GGML's rows: a copy of zeros changes nothing."""
    rng = np.random.default_rng(2)
    data = encode(rng.standard_normal((32, 64)), "q4_0")
    w = from_numpy_bits(data, dt.uint8)
    zeros = from_numpy_bits(np.zeros_like(data), dt.uint8)
    x = rng.standard_normal((17, 64)).astype(F32)
    assert_bits(run_packed(cpu, x, w, zeros, None, "q4_0"), run_packed(cpu, x, w, None, None, "q4_0"))
    monkeypatch.setenv("KAEL_QUANT_ACTIVATIONS", "f32")
    assert_bits(run_packed(cpu, x[:1], w, zeros, None, "q4_0"), run_packed(cpu, x[:1], w, None, None, "q4_0"))
    monkeypatch.setenv("KAEL_QUANT_ACTIVATIONS", "auto")
    assert np.all(run_packed(cpu, x[:1], w, zeros, None, "q4_0") == 0)  # (the copy is what one row reads)


def test_refusals(cpu: Any) -> None:
    rng = np.random.default_rng(3)
    data = encode(rng.standard_normal((16, 64)), "q4_1")
    w = from_numpy_bits(data, dt.uint8)
    with pytest.raises(
        kael.KaelError,
        match=r"pack_quantized: .*no kernel for repacked q4_1 rows \(q8_0, q4_0, q5_0, iq4_nl, q4_k and q6_k",
    ):
        C.pack_quantized(cpu_empty(cpu, data.shape, dt.uint8), w, "q4_1")
    if not C.packable("q4_0"):
        return
    data = encode(rng.standard_normal((16, 64)), "q4_0")
    w = from_numpy_bits(data, dt.uint8)
    with pytest.raises(kael.ShapeError, match=r"pack_quantized: packed must be a contiguous uint8 copy of weight's"):
        C.pack_quantized(cpu_empty(cpu, (16, 18), dt.uint8), w, "q4_0")
    x = from_numpy_bits(rng.standard_normal((1, 64)).astype(F32), dt.float32)
    with pytest.raises(kael.ShapeError, match=r"quantized_linear: packed must be"):
        C.quantized_linear(cpu_empty(cpu, (1, 16), dt.float32), x, w, None, "q4_0", cpu_empty(cpu, (8, 36), dt.uint8))


# -- the kernel table's copies (_repack) ---------------------------------------------------


def _linear(cpu: Any, x: np.ndarray, w: Any, scheme: str) -> np.ndarray:
    out = cpu_empty(cpu, (x.shape[0], w.shape[0]), dt.float32)
    cpu.kernel("quantized_linear")(out, from_numpy_bits(x.astype(F32), dt.float32), w, None, scheme)
    return logical(out)


@needs_kernel
def test_one_copy_per_weight_view_remade_after_a_write(cpu: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two weights that are one storage's rows (a fused buffer's parts) share one copy of the whole, made once; an
    in-place write through kael makes a new one; with KAEL_REPACK=0 none is made or read. Every result is the
    model's."""
    rng = np.random.default_rng(4)
    a, b = encode(rng.standard_normal((32, 64)), "q8_0"), encode(rng.standard_normal((32, 64)), "q8_0")
    both = kael.tensor(np.concatenate([a, b]), dtype=kael.uint8)
    wa, wb = both[:32], both[32:]
    x = rng.standard_normal((2, 64)).astype(F32)
    made = []
    monkeypatch.setattr(_repack, "C", _Counting(made))
    for _ in range(2):
        assert_bits(_linear(cpu, x, wa, "q8_0"), model(x, a, None, "q8_0"))
        assert_bits(_linear(cpu, x, wb, "q8_0"), model(x, b, None, "q8_0"))
    assert len(made) == 1
    with kael.no_grad():
        wa.copy_(kael.tensor(b, dtype=kael.uint8))  # an in-place write: the storage's version moves
    assert_bits(_linear(cpu, x, wa, "q8_0"), model(x, b, None, "q8_0"))
    assert_bits(_linear(cpu, x, wb, "q8_0"), model(x, b, None, "q8_0"))
    assert len(made) == 2
    monkeypatch.setenv("KAEL_REPACK", "0")  # the kernel reads no copy (a zero one here), and none is made
    zeros = from_numpy_bits(np.zeros((32, 68), np.uint8), dt.uint8)
    assert_bits(run_packed(cpu, x, wa, zeros, None, "q8_0"), model(x, b, None, "q8_0"))
    fresh = kael.tensor(a, dtype=kael.uint8)
    assert_bits(_linear(cpu, x, fresh, "q8_0"), model(x, a, None, "q8_0"))
    assert len(made) == 2


@needs_kernel
@pytest.mark.parametrize("scheme", ["q8_0", "q4_k"])
def test_fused_parts_and_the_fused_product_read_one_copy(
    cpu: Any, scheme: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fused q/k/v buffer's parts (48, 16 and 24 rows) and the fused product (a prompt's projections read the
    parts, a decode step the whole) are served by one copy of the storage: each part's rows in it are NOTE
    [repacked rows]' layout of the part alone (its rows after the last whole slab in GGML's), and each result is
    the model's. A part that does not start a slab of the whole gets a copy of its own."""
    monkeypatch.setattr(_repack, "_chunks", _repack._Chunks())
    rng = np.random.default_rng(8)
    k = 256
    parts = [_encode(rng, (n, k), scheme) for n in (48, 16, 24)]
    whole = kael.tensor(np.concatenate(parts), dtype=kael.uint8)
    views = [whole[0:48], whole[48:64], whole[64:88]]
    x = rng.standard_normal((3, k)).astype(F32)
    made: list[str] = []
    monkeypatch.setattr(_repack, "C", _Counting(made))
    for v, d in zip(views, parts):
        assert_bits(_linear(cpu, x, v, scheme), _model(x, d, scheme))
        np.testing.assert_array_equal(logical(_repack._by_weight[id(v)][2]), layout(d, scheme))
    assert_bits(_linear(cpu, x, whole, scheme), _model(x, np.concatenate(parts), scheme))
    assert len(made) == 1
    odd = whole[8:40]  # rows 8..39: not a slab of the whole's copy
    assert_bits(_linear(cpu, x, odd, scheme), _model(x, np.concatenate(parts)[8:40], scheme))
    np.testing.assert_array_equal(logical(_repack._by_weight[id(odd)][2]), layout(np.concatenate(parts)[8:40], scheme))
    assert len(made) == 2


@needs_kernel
def test_a_storage_far_larger_than_its_weight_is_not_copied_whole(cpu: Any) -> None:
    """A weight that is a small part of its storage (a file's mapping, a loader's shared buffer), or of a read-only
    one, gets a copy of its own rows only."""
    rng = np.random.default_rng(9)
    data = encode(rng.standard_normal((16 * 9, 64)), "q8_0")
    big = kael.tensor(data, dtype=kael.uint8)
    w = big[16:32]  # 1/9 of the storage
    x = rng.standard_normal((1, 64)).astype(F32)
    assert_bits(_linear(cpu, x, w, "q8_0"), model(x, data[16:32], None, "q8_0"))
    assert _repack._by_weight[id(w)][2].shape == (16, 68)
    assert sum(c.shape[0] for _, c in _repack._copies[big.untyped_storage()].values()) == 16
    frozen = data.copy()
    frozen.flags.writeable = False
    ro = kael.from_numpy(frozen)[:32]
    assert_bits(_linear(cpu, x, ro, "q8_0"), model(x, data[:32], None, "q8_0"))
    assert _repack._by_weight[id(ro)][2].shape == (32, 68)


def _encode(rng: np.random.Generator, shape: tuple[int, int], scheme: str) -> np.ndarray:
    return k_weights(rng, shape[0], shape[1], scheme) if scheme in SUPER else encode(rng.standard_normal(shape), scheme)


def _model(x: np.ndarray, data: np.ndarray, scheme: str) -> np.ndarray:
    return k_model(x, data, None, scheme) if scheme in SUPER else model(x, data, None, scheme)


class _Counting:
    """_C with pack_quantized counted."""

    def __init__(self, made: list[str]) -> None:
        self.made = made

    def pack_quantized(self, out: Any, weight: Any, scheme: str) -> None:
        self.made.append(scheme)
        C.pack_quantized(out, weight, scheme)

    def __getattr__(self, name: str) -> Any:
        return getattr(C, name)


def test_no_copy_where_the_kernel_cannot_use_one(cpu: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Formats without the kernel, weights of fewer than 16 rows, prompts (more than 16 rows) and the float path
    make no copy."""
    rng = np.random.default_rng(5)
    w1 = kael.tensor(encode(rng.standard_normal((32, 64)), "q4_1"), dtype=kael.uint8)
    w2 = kael.tensor(encode(rng.standard_normal((8, 64)), "q4_0"), dtype=kael.uint8)
    w3 = kael.tensor(encode(rng.standard_normal((32, 64)), "q4_0"), dtype=kael.uint8)
    assert _repack.packed_copy(w1, "q4_1", kael.zeros(1, 64)) is None
    assert _repack.packed_copy(w2, "q4_0", kael.zeros(1, 64)) is None
    assert _repack.packed_copy(w3, "q4_0", kael.zeros(17, 64)) is None
    monkeypatch.setenv("KAEL_QUANT_ACTIVATIONS", "f32")  # the float path, which reads none
    assert _repack.packed_copy(w3, "q4_0", kael.zeros(1, 64)) is None


@needs_kernel
def test_copies_go_with_their_weights(cpu: Any) -> None:
    """A weight's per-call entry and its copy are dropped when the weight is (no copy outlives its weight)."""
    import gc

    rng = np.random.default_rng(6)
    data = encode(rng.standard_normal((32, 64)), "q4_0")
    w = kael.tensor(data, dtype=kael.uint8)
    x = rng.standard_normal((1, 64)).astype(F32)
    assert_bits(_linear(cpu, x, w, "q4_0"), model(x, data, None, "q4_0"))
    key, copies = id(w), len(_repack._copies)
    assert key in _repack._by_weight and w.untyped_storage() in _repack._copies
    del w
    gc.collect()
    assert key not in _repack._by_weight
    assert len(_repack._copies) == copies - 1


@needs_kernel
def test_copies_lie_back_to_back_in_call_order(cpu: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Copies made one after another sit one after another in a chunk, each at a 64-byte boundary (a decode step
    streams through them as through one buffer), and read as their weights: the model's results."""
    monkeypatch.setattr(_repack, "_chunks", _repack._Chunks())
    rng = np.random.default_rng(7)
    datas = [encode(rng.standard_normal((n, 64)), s) for n, s in ((32, "q4_0"), (48, "q8_0"), (16, "q4_0"))]
    schemes = ["q4_0", "q8_0", "q4_0"]
    ws = [kael.tensor(d, dtype=kael.uint8) for d in datas]
    x = rng.standard_normal((1, 64)).astype(F32)
    copies = []
    for w, d, s in zip(ws, datas, schemes):
        assert_bits(_linear(cpu, x, w, s), model(x, d, None, s))
        copies.append(_repack._by_weight[id(w)][2])
    starts = [c.untyped_storage().data_ptr() + c.storage_offset() for c in copies]
    assert starts[0] % (2 << 20) == 0
    for (a, c), b in zip(zip(starts, copies), starts[1:]):
        assert b == a + (c.nbytes + 63) // 64 * 64
