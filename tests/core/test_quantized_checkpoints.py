"""Quantized checkpoints (kael/models/_weights.py): a model loaded with ``from_pretrained(weights=...)`` and
saved with ``save_pretrained`` reads back bit for bit, mapped or copied, sharded or not (the scheme and each
quantized tensor's shape in the safetensors metadata), and malformed quantization metadata, a missing tensor,
a tensor of the wrong bytes or dtype, or a block tensor without metadata are FormatErrors naming the file. The
checkpoints are small random GPT-2 and Llama-family models built offline with transformers.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import kael
import numpy as np
import pytest
from kael._tensor import numpy_bits
from kael.io import load_safetensors_with_metadata, save_safetensors
from kael.models._weights import QUANTIZATION_KEY, WEIGHTS_KEY, QuantizedTable
from kael.quant import QuantizedLinear
from quantized_models_common import SCHEMES, build_checkpoints, from_pretrained
from quantized_models_common import logits_of as _logits
from quantized_models_common import random_ids as _ids

pytest.importorskip("gguf")
pytest.importorskip("torch")
pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Any]]:
    """A small random checkpoint of each family: (directory, the transformers model)."""
    return build_checkpoints(tmp_path_factory)


# -- quantized checkpoints ----------------------------------------------------------------------------
@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("family", ["gpt2", "llama", "llama-tied"])
def test_save_load_round_trip_is_bit_exact(
    checkpoints: dict[str, tuple[Path, Any]], family: str, scheme: str, tmp_path: Path
) -> None:
    model = from_pretrained(checkpoints[family][0], weights=scheme)
    model.save_pretrained(tmp_path)
    _, meta = load_safetensors_with_metadata(tmp_path / "model.safetensors")
    assert meta is not None and meta[WEIGHTS_KEY] == scheme
    spec = json.loads(meta[QUANTIZATION_KEY])
    assert spec["version"] == 1
    prefix = "transformer." if family == "gpt2" else ""
    want = {
        prefix + name + ".weight": {
            "scheme": mod.scheme,
            "shape": [mod.num_embeddings, mod.dim]
            if isinstance(mod, QuantizedTable)
            else [mod.out_features, mod.in_features],
        }
        for name, mod in model.named_modules()
        if isinstance(mod, (QuantizedLinear, QuantizedTable))
    }
    assert spec["tensors"] == want
    ids = _ids(family, 12)
    for mmap in (False, True):
        again = from_pretrained(tmp_path, mmap=mmap)
        assert again.weights_scheme == scheme
        a, b = model.state_dict(), again.state_dict()
        assert list(a) == list(b)
        for key in a:
            assert a[key].dtype is b[key].dtype
            np.testing.assert_array_equal(numpy_bits(a[key]), numpy_bits(b[key]))
        np.testing.assert_array_equal(_logits(again, ids), _logits(model, ids))


def test_a_sharded_quantized_checkpoint_loads(checkpoints: dict[str, tuple[Path, Any]], tmp_path: Path) -> None:
    """Each shard carries the metadata (save_checkpoint_tensors writes it to every one)."""
    import shutil

    from kael.io import save_checkpoint_tensors
    from kael.models._weights import quantization_metadata

    d, _ = checkpoints["llama"]
    model = from_pretrained(d, weights="q4_0")
    meta = {"format": "pt", **quantization_metadata(model, lambda name: f"{name}.weight")}
    files = save_checkpoint_tensors(tmp_path, model.state_dict(), max_shard_size="20KB", metadata=meta)
    assert len(files) > 3 and "model.safetensors.index.json" in files
    shutil.copy(d / "config.json", tmp_path / "config.json")
    again = from_pretrained(tmp_path)
    assert again.weights_scheme == "q4_0"
    ids = _ids("llama", 10)
    np.testing.assert_array_equal(_logits(again, ids), _logits(model, ids))


def _rewrite(
    path: Path, *, meta: dict[str, str] | None = None, drop: str | None = None, replace: dict[str, Any] | None = None
) -> None:
    """Rewrite a safetensors file with changed metadata, a tensor dropped or replaced."""
    tensors, old = load_safetensors_with_metadata(path)  # a copy in memory: the file may be replaced
    if drop is not None:
        del tensors[drop]
    tensors.update(replace or {})
    save_safetensors(tensors, path, metadata={**(old or {}), **(meta or {})})


@pytest.fixture
def quantized_dir(checkpoints: dict[str, tuple[Path, Any]], tmp_path: Path) -> Path:
    from_pretrained(checkpoints["llama"][0], weights="q8_0").save_pretrained(tmp_path)
    return tmp_path


def _spec(d: Path) -> dict[str, Any]:
    _, meta = load_safetensors_with_metadata(d / "model.safetensors")
    assert meta is not None
    out: dict[str, Any] = json.loads(meta[QUANTIZATION_KEY])
    return out


KEY = "model.layers.0.mlp.down_proj.weight"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda s: "{not json", r"metadata 'kael.quantization' is not JSON"),
        (lambda s: json.dumps({**s, "version": 2}), r'expected \{"version": 1, "tensors"'),
        (lambda s: json.dumps([1]), r'expected \{"version": 1, "tensors"'),
        (
            lambda s: json.dumps({**s, "tensors": {**s["tensors"], KEY: {"scheme": "q7_0", "shape": [64, 128]}}}),
            rf"tensor '{KEY}' has scheme 'q7_0', expected one of",
        ),
        (
            lambda s: json.dumps({**s, "tensors": {**s["tensors"], KEY: {"scheme": "q8_0", "shape": [64, 100]}}}),
            rf"tensor '{KEY}' has shape \[64, 100\]; q8_0 needs in_features a multiple of 32",
        ),
        (
            lambda s: json.dumps({**s, "tensors": {**s["tensors"], KEY: {"scheme": "q8_0", "shape": [64]}}}),
            rf"tensor '{KEY}' has shape \[64\], expected \[out, in\]",
        ),
        (
            lambda s: json.dumps({**s, "tensors": {**s["tensors"], KEY: {"scheme": "q8_0", "shape": [64, 256]}}}),
            rf"gives '{KEY}' the shape \[64, 256\], the model's module is \[64, 128\]",
        ),
        (
            lambda s: json.dumps({**s, "tensors": {**s["tensors"], KEY: {"scheme": "q4_0", "shape": [64, 128]}}}),
            rf"'{KEY}' is uint8 \[64, 136\], its quantization metadata needs uint8 \[64, 72\]",
        ),
        (
            lambda s: json.dumps(
                {**s, "tensors": {**s["tensors"], "model.norm.weight": {"scheme": "q8_0", "shape": [64, 64]}}}
            ),
            r"names 'model.norm.weight', which is not a projection or token table",
        ),
        (
            lambda s: json.dumps(
                {**s, "tensors": {**s["tensors"], "model.bogus.weight": {"scheme": "q8_0", "shape": [64, 64]}}}
            ),
            r"names 'model.bogus.weight', which is no module of the model",
        ),
        (
            lambda s: json.dumps(
                {**s, "tensors": {**s["tensors"], KEY: {"scheme": "q8_0", "shape": [64, 128], "x": 1}}}
            ),
            rf"tensor '{KEY}' must be",
        ),
    ],
)
def test_malformed_quantization_metadata_is_a_format_error(quantized_dir: Path, change: Any, message: str) -> None:
    _rewrite(quantized_dir / "model.safetensors", meta={QUANTIZATION_KEY: change(_spec(quantized_dir))})
    with pytest.raises(kael.FormatError, match=message) as info:
        from_pretrained(quantized_dir)
    assert "model.safetensors" in str(info.value)


def test_metadata_naming_a_missing_tensor_is_a_format_error(quantized_dir: Path) -> None:
    _rewrite(quantized_dir / "model.safetensors", drop=KEY)
    with pytest.raises(kael.FormatError, match=rf"missing tensor '{KEY}'") as info:
        from_pretrained(quantized_dir)
    assert str(quantized_dir) in str(info.value)


def test_a_quantized_tensor_of_the_wrong_bytes_or_dtype_is_a_format_error(quantized_dir: Path) -> None:
    _rewrite(quantized_dir / "model.safetensors", replace={KEY: kael.zeros(64, 3 * 34, dtype=kael.uint8)})
    with pytest.raises(
        kael.FormatError, match=rf"'{KEY}' is uint8 \[64, 102\], its quantization metadata needs uint8 \[64, 136\]"
    ):
        from_pretrained(quantized_dir)
    _rewrite(quantized_dir / "model.safetensors", replace={KEY: kael.zeros(64, 4 * 34, dtype=kael.float32)})
    with pytest.raises(
        kael.FormatError, match=rf"'{KEY}' is float32 \[64, 136\], its quantization metadata needs uint8"
    ):
        from_pretrained(quantized_dir)


def test_a_block_tensor_without_metadata_is_a_format_error(quantized_dir: Path) -> None:
    tensors, old = load_safetensors_with_metadata(quantized_dir / "model.safetensors")
    assert old is not None
    meta = {k: v for k, v in old.items() if k not in (QUANTIZATION_KEY, WEIGHTS_KEY)}
    save_safetensors(tensors, quantized_dir / "model.safetensors", metadata=meta)
    with pytest.raises(kael.FormatError, match="model.layers.0"):
        from_pretrained(quantized_dir)


def test_a_quantized_gpt2_checkpoint_is_checked_too(checkpoints: dict[str, tuple[Path, Any]], tmp_path: Path) -> None:
    from_pretrained(checkpoints["gpt2"][0], weights="q4_0").save_pretrained(tmp_path)
    key = "transformer.h.1.mlp.c_fc.weight"
    _rewrite(tmp_path / "model.safetensors", replace={key: kael.zeros(256, 2 * 18 - 1, dtype=kael.uint8)})
    with pytest.raises(kael.FormatError, match=rf"'{key}' has shape \[256, 35\], the model expects \[256, 36\]"):
        from_pretrained(tmp_path)
    _rewrite(tmp_path / "model.safetensors", drop=key)
    with pytest.raises(kael.FormatError, match=rf"missing key\(s\) \['{key}'\]"):
        from_pretrained(tmp_path)
