"""KAEL_GELU=ggml (kael/ops/_gelu_ggml.py, NOTE [ggml GELU table]) against ggml's own table: the 65536 float16
GELU values ``ggml_table_gelu_f16`` that llama-cpp-python's libggml-cpu fills in ``ggml_cpu_init``, read
through ctypes, with ggml's thresholds (``ggml_vec_gelu_f32`` / ``ggml_vec_geglu_f32``). Skipped without
llama_cpp; the mode's other rules (the default unchanged, 16-bit inputs unaffected, a bad value refused,
GPT-2's decode step) need no oracle but kael's own exact path."""

from __future__ import annotations

import ctypes
import os

import kael
import llama_cpp_tools
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kael.ops import gelu, gelu_tanh_mul

_TABLE: list[np.ndarray] = []


def _ggml_table() -> np.ndarray:
    """ggml_table_gelu_f16 as float32 [65536], indexed by a float16's bits."""
    if not _TABLE:
        lib = llama_cpp_tools.ggml_library("libggml-cpu.so")
        lib.ggml_cpu_init.restype, lib.ggml_cpu_init.argtypes = None, []
        lib.ggml_cpu_init()
        raw = (ctypes.c_uint16 * 65536).in_dll(lib, "ggml_table_gelu_f16")
        _TABLE.append(np.frombuffer(bytes(raw), np.float16).astype(np.float32))
    return _TABLE[0]


def ggml_gelu(x: np.ndarray) -> np.ndarray:
    """ggml_vec_gelu_f32 of a float32 array, from ggml's table."""
    x = np.asarray(x, np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        looked = _ggml_table()[x.astype(np.float16).view(np.uint16)]
    return np.where(x <= -10, np.float32(0), np.where(x >= 10, x, looked)).astype(np.float32)


def _all_float16_values() -> np.ndarray:
    """Every finite float16 value as float32, and the values around ggml's thresholds and beyond them."""
    h = np.arange(65536, dtype=np.uint16).view(np.float16).astype(np.float32)
    edges = np.array([-10, 10, np.nextafter(-10, 0), np.nextafter(10, 0), 1e5, -1e5, np.inf, -np.inf], np.float32)
    return np.concatenate([h[np.isfinite(h)], edges])


def _bits(a: np.ndarray) -> np.ndarray:
    return np.asarray(a, np.float32).view(np.uint32)


def test_every_float16_input_reads_ggml_table(monkeypatch: pytest.MonkeyPatch) -> None:
    x = _all_float16_values()
    monkeypatch.setenv("KAEL_GELU", "ggml")
    got = gelu(kael.tensor(x), "tanh").numpy()
    np.testing.assert_array_equal(_bits(got), _bits(ggml_gelu(x)))


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), scale=st.sampled_from([0.01, 1.0, 4.0, 30.0]), n=st.integers(1, 3000))
def test_geglu_is_ggml_geglu_on_float32_inputs(seed: int, scale: float, n: int) -> None:
    """Any float32 gate (not only float16 values): ggml rounds it to float16 to index the table."""
    rng = np.random.default_rng(seed)
    gate = (rng.standard_normal(n) * scale).astype(np.float32)
    up = rng.standard_normal(n).astype(np.float32)
    expected = ggml_gelu(gate) * up
    os.environ["KAEL_GELU"] = "ggml"
    try:
        got = gelu_tanh_mul(kael.tensor(gate), kael.tensor(up)).numpy()
    finally:
        del os.environ["KAEL_GELU"]
    np.testing.assert_array_equal(_bits(got), _bits(expected))


def test_exact_is_the_default_and_differs_from_the_table(monkeypatch: pytest.MonkeyPatch) -> None:
    x = np.linspace(-6, 6, 4001).astype(np.float32)
    default = gelu(kael.tensor(x), "tanh").numpy()
    monkeypatch.setenv("KAEL_GELU", "exact")
    np.testing.assert_array_equal(_bits(gelu(kael.tensor(x), "tanh").numpy()), _bits(default))
    monkeypatch.setenv("KAEL_GELU", "ggml")
    table = gelu(kael.tensor(x), "tanh").numpy()
    # float64 oracle of the smooth function: the default is float32-accurate, the table float16-accurate
    x64 = x.astype(np.float64)
    smooth = 0.5 * x64 * (1 + np.tanh(np.sqrt(2 / np.pi) * (x64 + 0.044715 * x64**3)))
    assert np.abs(default - smooth).max() < 1e-6
    assert 1e-4 < np.abs(table - smooth).max() < 4e-3


def test_16_bit_inputs_and_the_erf_gelu_are_unaffected(monkeypatch: pytest.MonkeyPatch) -> None:
    x = np.linspace(-4, 4, 257).astype(np.float32)
    cases = [
        (kael.tensor(x).to(kael.float16), "tanh"),
        (kael.tensor(x).to(kael.bfloat16), "tanh"),
        (kael.tensor(x), "none"),
    ]
    before = [gelu(t, a).to(kael.float32).numpy() for t, a in cases]
    monkeypatch.setenv("KAEL_GELU", "ggml")
    after = [gelu(t, a).to(kael.float32).numpy() for t, a in cases]
    for b, a in zip(before, after):
        np.testing.assert_array_equal(_bits(a), _bits(b))


def test_gradients_stay_those_of_the_smooth_function(monkeypatch: pytest.MonkeyPatch) -> None:
    x = np.linspace(-3, 3, 61).astype(np.float32)
    grads = []
    for mode in ("exact", "ggml"):
        monkeypatch.setenv("KAEL_GELU", mode)
        t = kael.tensor(x, requires_grad=True)
        gelu(t, "tanh").sum().backward()
        grads.append(t.grad.numpy())
    np.testing.assert_array_equal(grads[0], grads[1])


def test_a_bad_value_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KAEL_GELU", "fp16")
    with pytest.raises(kael.KaelError, match=r"gelu: KAEL_GELU must be 'exact' or 'ggml'.*got 'fp16'"):
        gelu(kael.tensor(np.ones(3, np.float32)), "tanh")


def test_gpt2_decode_step_uses_the_table(monkeypatch: pytest.MonkeyPatch) -> None:
    """GPT-2's direct decode step calls the backend's gelu kernel itself; under KAEL_GELU=ggml its logits are
    the general forward pass's under the same mode, and differ from the exact step's."""
    from gpt2_reference import logits_of, tiny_gpt
    from kael.models import GenericStep, decode_step

    model = tiny_gpt(vocab=97, ctx=32, layers=2, heads=2, dim=32, seed=3)
    ids = [(5 * i + 2) % 97 for i in range(24)]
    runs = {}
    for mode in ("exact", "ggml"):
        monkeypatch.setenv("KAEL_GELU", mode)
        cache = model.new_cache(max_positions=24)
        with kael.no_grad():
            model(kael.tensor([ids[:8]]), cache)
            step = decode_step(model, cache, True)
            assert not isinstance(step, GenericStep)
            rows = []
            for t in ids[8:]:
                rows.append(step([0], [t]).numpy()[0].copy())
                cache.lengths[0] += 1
        runs[mode] = np.stack(rows)
        np.testing.assert_allclose(runs[mode], logits_of(model, [ids])[0, 8:], atol=2e-5, rtol=0)
    assert np.abs(runs["exact"] - runs["ggml"]).max() > 1e-6
