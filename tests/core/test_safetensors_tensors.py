"""safetensors' tensor layer (``kael.io.load_safetensors`` / ``save_safetensors``, with and without
metadata): round trips of every dtype and shape, mapped and copied, through the reference ``safetensors``
package too, views of the file mapping when aligned, non-contiguous tensors saved in order, and the refusals
(a value that is no tensor, a bad device before any reading). Skipped while kael's Tensor does not work yet.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from kael._errors import FormatError
from kael.io._safetensors_load import load_arrays
from safetensors_files import NP_OF, REF_DTYPES, SHAPES
from safetensors_files import file_names as _only
from safetensors_files import is_mapped as _is_mapped
from safetensors_files import packed_file as _packed
from safetensors_files import same_bits as _same
from safetensors_files import sample_array as _sample

# -- the tensor layer -----------------------------------------------------------------------


@pytest.fixture
def kael_mod() -> Any:
    try:
        import kael
        import kael.io
        from kael._tensor import from_numpy

        from_numpy(np.zeros(2, np.float32))
    except Exception as e:  # the core is still being written
        pytest.skip(f"kael tensors not available yet: {e!r}")
    return kael


def _bits(t: Any) -> np.ndarray[Any, Any]:
    from kael._tensor import numpy_bits

    out: np.ndarray[Any, Any] = numpy_bits(t)
    return out


@pytest.mark.parametrize("use_mmap", [False, True])
def test_tensor_round_trip(tmp_path: Path, kael_mod: Any, use_mmap: bool) -> None:
    from kael._dtype import BY_NAME
    from kael._tensor import from_numpy_bits

    tensors = {f"{d}{i}": from_numpy_bits(_sample(d, s, i), BY_NAME[d]) for d in NP_OF for i, s in enumerate(SHAPES)}
    path = tmp_path / "t.safetensors"
    kael_mod.io.save_safetensors(tensors, path, metadata={"a": "b"})
    loaded, meta = kael_mod.io.load_safetensors_with_metadata(path, mmap=use_mmap)
    assert meta == {"a": "b"}
    assert list(loaded) == list(tensors)
    for name, t in tensors.items():
        assert loaded[name].dtype is t.dtype and tuple(loaded[name].shape) == tuple(t.shape)
        assert _same(_bits(loaded[name]), _bits(t))
    plain = kael_mod.io.load_safetensors(path, mmap=use_mmap)
    assert list(plain) == list(tensors)


def test_tensor_mapped_views(tmp_path: Path, kael_mod: Any) -> None:
    loaded = kael_mod.io.load_safetensors(_packed(tmp_path), mmap=True)
    assert _bits(loaded["f"]).tolist() == [1.5, -2.0]
    assert _bits(loaded["i"]).tolist() == [[123456789]]
    assert _is_mapped(loaded["f"]._storage.data)
    assert not _is_mapped(loaded["i"]._storage.data)


def test_tensor_save_rejects_non_tensors(tmp_path: Path, kael_mod: Any) -> None:
    with pytest.raises(FormatError, match="value"):
        kael_mod.io.save_safetensors({"w": np.zeros(2)}, tmp_path / "x.safetensors")
    with pytest.raises(FormatError, match="value"):
        kael_mod.io.save_safetensors([1], tmp_path / "x.safetensors")
    assert _only(tmp_path) == []


def test_tensor_round_trip_through_the_reference_package(tmp_path: Path, kael_mod: Any) -> None:
    stnp = pytest.importorskip("safetensors.numpy")
    tensors = {f"{d}{i}": kael_mod.from_numpy(_sample(d, s, i)) for d in REF_DTYPES for i, s in enumerate(SHAPES)}
    ours = tmp_path / "kael.safetensors"
    kael_mod.save_safetensors(tensors, ours)
    ref = stnp.load_file(str(ours))
    theirs = tmp_path / "ref.safetensors"
    stnp.save_file(ref, str(theirs))
    for m in (False, True):
        back = kael_mod.load_safetensors(theirs, mmap=m)
        assert set(back) == set(tensors)
        for name, t in tensors.items():
            assert back[name].dtype is t.dtype and _same(_bits(back[name]), _bits(t))


def test_tensor_save_of_non_contiguous_tensors(tmp_path: Path, kael_mod: Any) -> None:
    base = np.arange(12, dtype=np.float32).reshape(3, 4)
    t = kael_mod.transpose(kael_mod.from_numpy(base), 0, 1)
    path = tmp_path / "nc.safetensors"
    kael_mod.save_safetensors({"t": t}, path)
    loaded, _ = load_arrays(path)
    assert _same(loaded["t"][0], np.ascontiguousarray(base.T))


def test_tensor_load_rejects_a_bad_device_before_reading(tmp_path: Path, kael_mod: Any) -> None:
    with pytest.raises(kael_mod.DeviceError):
        kael_mod.load_safetensors(tmp_path / "missing.safetensors", device="not a device")
