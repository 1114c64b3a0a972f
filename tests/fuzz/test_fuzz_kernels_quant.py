"""fuzz_kernels' checks of the weight-format ops find the bugs they are for.

A backend that wraps the C++ one and breaks one promise (a dequantized zero's sign, a
result that depends on KAEL_REPACK, on the number of rows, or a far-off default path, a
write past the output) must fail `check`; the C++ backend itself passes the same inputs.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

FUZZ = Path(__file__).resolve().parents[2] / "fuzz"
if str(FUZZ) not in sys.path:
    sys.path.insert(0, str(FUZZ))

import kernel_spec as ks  # noqa: E402

SEED = b"\x05\x00\x00\x00"


@pytest.fixture(scope="module")
def fk() -> ModuleType:
    import kael

    if "cpu" not in {b.name for b in kael.backends.available()}:
        pytest.skip("fuzz_kernels needs the C++ backend (kael-backend-cpu)")
    import fuzz_kernels

    return fuzz_kernels


class Broken:
    """The C++ backend with one kernel replaced by `wrap(kernel)`."""

    def __init__(self, inner: Any, op: str, wrap: Callable[[Callable[..., None]], Callable[..., None]]) -> None:
        self.inner, self.op, self.wrap = inner, op, wrap

    def kernel(self, name: str) -> Callable[..., None]:
        k = self.inner.kernel(name)
        return self.wrap(k) if name == self.op else k

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _then(fk: ModuleType, change: Callable[[np.ndarray, list[Any]], None]) -> Callable[..., Callable[..., None]]:
    """A kernel wrapper: run the kernel, then `change` the output's values (a host copy, written back)."""

    def wrap(k: Callable[..., None]) -> Callable[..., None]:
        def run(out: Any, *args: Any) -> None:
            k(out, *args)
            values = np.array(fk.BACKEND.to_host(out), dtype=np.float32)
            change(values, [out, *args])
            fk.BACKEND.from_host(out, np.ascontiguousarray(values))

        return run

    return wrap


LINEAR = ks.encode_quant("quantized_linear", "q8_0", 20, 1, 4, bias=True, extra=bytes(12) + SEED)
DEQUANT = ks.encode_quant("dequantize", "q4_0", 3, 1, extra=bytes(6) + SEED)


def test_the_cpu_backend_passes(fk: ModuleType) -> None:
    fk.check(ks.decode(LINEAR))
    fk.check(ks.decode(DEQUANT))


def _fails(fk: ModuleType, monkeypatch: pytest.MonkeyPatch, data: bytes, op: str, wrap: Any, match: str) -> None:
    monkeypatch.setattr(fk, "BACKEND", Broken(fk.BACKEND, op, wrap))
    with pytest.raises(AssertionError, match=match):
        fk.check(ks.decode(data))


def test_a_dequantized_value_one_ulp_off_fails(fk: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    """Within any float tolerance, but not the same bits."""

    def one_ulp(v: np.ndarray, args: list[Any]) -> None:
        v.reshape(-1).view(np.uint32)[0] ^= 1

    data = ks.encode_quant("dequantize", "q8_0", 2, 1, quantized=True, extra=bytes(6) + SEED)
    _fails(fk, monkeypatch, data, "dequantize", _then(fk, one_ulp), "differ in their bits")


def test_a_result_that_depends_on_repacking_fails(fk: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    def by_env(v: np.ndarray, args: list[Any]) -> None:
        if os.environ.get("KAEL_REPACK") == "0":
            v.view(np.uint32)[...] ^= 1  # one ulp everywhere

    data = ks.encode_quant("quantized_linear", "q8_0", 20, 1, 4, repack=(True, False), extra=bytes(9) + SEED)
    _fails(fk, monkeypatch, data, "quantized_linear", _then(fk, by_env), "second run against its first")


def test_a_row_that_depends_on_the_batch_fails(fk: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    def by_rows(v: np.ndarray, args: list[Any]) -> None:
        if v.size > v.shape[-1]:  # more than one row
            v.reshape(-1, v.shape[-1]).view(np.uint32)[-1, 0] ^= 1  # the last row's first value

    _fails(fk, monkeypatch, LINEAR, "quantized_linear", _then(fk, by_rows), "alone against row")


def test_a_far_off_result_fails(fk: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    def off(v: np.ndarray, args: list[Any]) -> None:
        v.reshape(-1)[0] += 1.0

    _fails(fk, monkeypatch, LINEAR, "quantized_linear", _then(fk, off), "bound")


def test_a_write_past_the_output_fails(fk: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    def spill(k: Callable[..., None]) -> Callable[..., None]:
        def run(out: Any, *args: Any) -> None:
            k(out, *args)
            storage = out.untyped_storage()  # a dense output here: the element after its last
            after = fk.memory.wrap_buffer(
                storage.data, storage.nbytes, fk.CPU, (1,), (1,), out.dtype, out.storage_offset() + out.numel()
            )
            fk.BACKEND.inner.kernel("fill")(after, 7.0)

        return run

    _fails(fk, monkeypatch, LINEAR, "quantized_linear", spill, "outside its output")
