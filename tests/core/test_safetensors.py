"""safetensors' NumPy layer (``load_arrays``, ``save_arrays``, ``decode_buffer``): round trips of every dtype
and shape (and hypothesis-drawn ones), interop with the reference ``safetensors`` package (bfloat16 through
torch), mapped mode (zero-copy views when a tensor is aligned, copies otherwise, writes never reaching the
file), and saving (an invalid save or a failure while writing leaves no file, the old file kept). Malformed
files are tested in test_safetensors_malformed.py, the tensor layer in test_safetensors_tensors.py.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from kael._errors import FormatError
from kael.io._safetensors_format import DTYPES, decode_buffer
from kael.io._safetensors_load import load_arrays
from kael.io._safetensors_save import save_arrays, save_entries
from safetensors_files import NP_OF, REF_DTYPES, SHAPES
from safetensors_files import file_names as _only
from safetensors_files import is_mapped as _is_mapped
from safetensors_files import packed_file as _packed
from safetensors_files import same_bits as _same
from safetensors_files import sample_array as _sample

# -- round trips (NumPy layer) -------------------------------------------------------------


@pytest.mark.parametrize("use_mmap", [False, True])
@pytest.mark.parametrize("dtype", list(NP_OF))
def test_round_trip_every_dtype_and_shape(tmp_path: Path, dtype: str, use_mmap: bool) -> None:
    arrays = {f"t{i}": (_sample(dtype, s, i), dtype) for i, s in enumerate(SHAPES)}
    path = tmp_path / "rt.safetensors"
    save_arrays(arrays, path, metadata={"format": "np", "ünï": "cödé"})
    loaded, meta = load_arrays(path, mmap=use_mmap)
    assert meta == {"format": "np", "ünï": "cödé"}
    assert list(loaded) == list(arrays)
    for name, (arr, d) in arrays.items():
        got, got_dtype = loaded[name]
        assert got_dtype == d
        assert _same(got, arr)


def test_no_metadata_and_no_tensors(tmp_path: Path) -> None:
    path = tmp_path / "empty.safetensors"
    save_arrays({}, path)
    assert path.read_bytes() == struct.pack("<Q", 8) + b"{}      "
    for m in (False, True):
        assert load_arrays(path, mmap=m) == ({}, None)


def test_header_is_padded_with_spaces_to_8_bytes(tmp_path: Path) -> None:
    path = tmp_path / "p.safetensors"
    save_arrays({"abc": (np.arange(3, dtype=np.float32), "float32")}, path, metadata={"k": "v"})
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = raw[8 : 8 + n]
    assert n % 8 == 0
    assert json.loads(header) == {
        "__metadata__": {"k": "v"},
        "abc": {"dtype": "F32", "shape": [3], "data_offsets": [0, 12]},
    }
    assert header.rstrip(b" ") + b" " * (n - len(header.rstrip(b" "))) == header
    assert raw[8 + n :] == np.arange(3, dtype="<f4").tobytes()


def _tagged_arrays(dtype: str) -> st.SearchStrategy[tuple[np.ndarray[Any, Any], str]]:
    shapes = hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=4)
    return hnp.arrays(NP_OF[dtype], shapes).map(lambda a: (a, dtype))


arrays_strategy = st.dictionaries(
    st.text(min_size=0, max_size=8).filter(lambda s: s != "__metadata__"),
    st.sampled_from(list(NP_OF)).flatmap(_tagged_arrays),
    max_size=5,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(arrays=arrays_strategy, metadata=st.none() | st.dictionaries(st.text(max_size=5), st.text(max_size=5)))
def test_round_trip_property(tmp_path: Path, arrays: dict[str, Any], metadata: dict[str, str] | None) -> None:
    path = tmp_path / "h.safetensors"
    save_arrays(arrays, path, metadata)
    for m in (False, True):
        loaded, meta = load_arrays(path, mmap=m)
        assert meta == metadata
        assert list(loaded) == list(arrays)
        for name, (arr, d) in arrays.items():
            assert loaded[name][1] == d
            assert _same(loaded[name][0], arr)
    loaded_bytes, _ = decode_buffer(path.read_bytes())
    assert all(_same(loaded_bytes[k][0], a) for k, (a, _) in arrays.items())


# -- interoperability with the reference implementation ------------------------------------


def test_kael_file_reads_in_safetensors_and_back(tmp_path: Path) -> None:
    stnp = pytest.importorskip("safetensors.numpy")
    arrays = {f"{d}_{i}": (_sample(d, s, i), d) for d in REF_DTYPES for i, s in enumerate(SHAPES)}
    ours = tmp_path / "kael.safetensors"
    save_arrays(arrays, ours, metadata={"who": "kael"})
    ref = stnp.load_file(str(ours))
    assert set(ref) == set(arrays)
    for name, (arr, _) in arrays.items():
        assert ref[name].dtype == arr.dtype and ref[name].shape == arr.shape
        assert np.array_equal(ref[name], arr)
    again = tmp_path / "ref.safetensors"
    stnp.save_file(ref, str(again), metadata={"who": "ref"})
    for m in (False, True):
        loaded, meta = load_arrays(again, mmap=m)
        assert meta == {"who": "ref"}
        for name, (arr, d) in arrays.items():
            assert loaded[name][1] == d
            assert np.array_equal(loaded[name][0], arr)


def test_reference_written_file_maps_every_tensor(tmp_path: Path) -> None:
    stnp = pytest.importorskip("safetensors.numpy")
    ref: dict[str, np.ndarray[Any, Any]] = {
        "a": np.ones(3, np.int8),
        "b": np.arange(5, dtype=np.float64),
        "c": np.zeros((2, 2), np.float16),
    }
    path = tmp_path / "ref.safetensors"
    stnp.save_file(ref, str(path))
    loaded, meta = load_arrays(path, mmap=True)
    assert meta is None
    for name, arr in ref.items():
        assert np.array_equal(loaded[name][0], arr)
        assert _is_mapped(loaded[name][0]), name  # the reference writer keeps every tensor aligned


def test_bfloat16_interop_through_torch(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    stt = pytest.importorskip("safetensors.torch")
    bits = _sample("bfloat16", (3, 4), 7)
    ours = tmp_path / "bf16.safetensors"
    save_arrays({"h": (bits, "bfloat16"), "f": (np.arange(3, dtype=np.float32), "float32")}, ours)
    ref = stt.load_file(str(ours))
    assert ref["h"].dtype == torch.bfloat16 and tuple(ref["h"].shape) == (3, 4)
    assert np.array_equal(ref["h"].view(torch.int16).numpy().view(np.uint16), bits)
    again = tmp_path / "torch.safetensors"
    stt.save_file({"h": ref["h"], "z": torch.zeros(0, 2, dtype=torch.bfloat16)}, str(again))
    for m in (False, True):
        loaded, _ = load_arrays(again, mmap=m)
        assert loaded["h"][1] == "bfloat16" and _same(loaded["h"][0], bits)
        assert loaded["z"][1] == "bfloat16" and loaded["z"][0].shape == (0, 2)


# -- mapped mode: zero-copy views when aligned, copies otherwise ---------------------------


def test_mapped_aligned_views_and_misaligned_copies(tmp_path: Path) -> None:
    path = _packed(tmp_path)
    loaded, meta = load_arrays(path, mmap=True)
    assert meta == {"seed": "fuzz"}
    f, b, i = (loaded[k][0] for k in "fbi")
    assert f.tolist() == [1.5, -2.0] and b.tolist() == [True] and i.tolist() == [[123456789]]
    assert _is_mapped(f) and _is_mapped(b)
    assert not _is_mapped(i) and i.flags.aligned
    # ACCESS_COPY: writable, and writes never reach the file
    before = path.read_bytes()
    f[0] = 42.0
    assert path.read_bytes() == before
    copied, _ = load_arrays(path, mmap=False)
    assert not any(_is_mapped(a) for a, _ in copied.values())
    assert all(a.flags.aligned and a.flags.writeable for a, _ in copied.values())


def test_mapping_outlives_the_file_handle(tmp_path: Path) -> None:
    path = _packed(tmp_path)
    loaded, _ = load_arrays(path, mmap=True)
    os.unlink(path)
    assert loaded["f"][0].tolist() == [1.5, -2.0]


# -- saving -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("arrays", "metadata", "rule"),
    [
        ({"w": [1, 2, 3]}, None, "value"),
        ({"w": (np.zeros(2, np.float32), "float32"), "x": ("nope", "float32")}, None, "value"),
        ({"__metadata__": (np.zeros(2, np.float32), "float32")}, None, "tensor name"),
        ({"\ud800": (np.zeros(2, np.float32), "float32")}, None, "invalid string"),
        ({"w": (np.zeros(2, np.complex64), "complex64")}, None, "dtype"),
        ({}, {"a": 1}, "__metadata__"),
        ({}, {1: "a"}, "__metadata__"),
        ({}, ["a"], "__metadata__"),
        ({}, {"a": "\udc00"}, "invalid string"),
    ],
)
def test_invalid_save_leaves_no_file(tmp_path: Path, arrays: Any, metadata: Any, rule: str) -> None:
    with pytest.raises(FormatError, match=f": {rule}: "):
        save_arrays(arrays, tmp_path / "out.safetensors", metadata)
    assert _only(tmp_path) == []


def test_failure_while_writing_removes_the_temp_and_keeps_the_old_file(tmp_path: Path) -> None:
    target = tmp_path / "out.safetensors"
    target.write_bytes(b"old")

    def boom() -> np.ndarray[Any, Any]:
        raise RuntimeError("device lost")

    entries = [("a", "float32", (2,), lambda: np.zeros(2, np.float32)), ("b", "float32", (2,), boom)]
    with pytest.raises(RuntimeError, match="device lost"):
        save_entries(entries, target, None, "test")
    assert _only(tmp_path) == ["out.safetensors"]
    assert target.read_bytes() == b"old"
    wrong = [("a", "float32", (2,), lambda: np.zeros(3, np.float32))]
    with pytest.raises(FormatError, match="data size"):
        save_entries(wrong, target, None, "test")
    assert _only(tmp_path) == ["out.safetensors"]


def test_saved_file_has_ordinary_permissions(tmp_path: Path) -> None:
    path = tmp_path / "perm.safetensors"
    save_arrays({}, path)
    mask = os.umask(0o022)
    os.umask(mask)
    assert (path.stat().st_mode & 0o777) == (0o666 & ~mask)


def test_dtype_table_matches_the_format() -> None:
    assert set(DTYPES) == {"F64", "F32", "F16", "BF16", "I64", "I32", "I16", "I8", "U8", "BOOL"}
    assert {v.kael for v in DTYPES.values()} == set(NP_OF)
