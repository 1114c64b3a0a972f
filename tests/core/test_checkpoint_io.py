"""Checkpoint directories (kael.io.load_checkpoint_tensors / save_checkpoint_tensors): Hugging
Face's single-file and sharded layouts against the ``safetensors`` package and transformers as
oracles, dtype handling, expectations, and one malformed-directory test per rule.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Any

import kael
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kael.io import (
    INDEX_NAME,
    SINGLE_NAME,
    load_checkpoint_tensors,
    read_checkpoint_entries,
    save_checkpoint_tensors,
)
from kael.io._checkpoint import parse_size

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")


def _llama_config() -> Any:
    return transformers.LlamaConfig(
        vocab_size=256,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )


@pytest.fixture(scope="module")
def hf_llama() -> Any:
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(_llama_config()).eval()


def _oracle(directory: Path) -> dict[str, Any]:
    """Every tensor of a checkpoint directory, read by the safetensors package."""
    out: dict[str, Any] = {}
    for p in sorted(directory.glob("*.safetensors")):
        out.update(safetensors_torch.load_file(str(p)))
    return out


def _bits(t: kael.Tensor) -> np.ndarray[Any, Any]:
    from kael._tensor import numpy_bits

    return np.asarray(numpy_bits(t))


def _torch_bits(t: Any) -> np.ndarray[Any, Any]:
    if t.dtype == torch.bfloat16:
        return t.contiguous().view(torch.int16).numpy().view(np.uint16)
    return t.contiguous().numpy()


# -- reading what transformers writes ----------------------------------------------------------


@pytest.mark.parametrize("shard", [None, "50KB"])
@pytest.mark.parametrize("torch_dtype", ["float32", "bfloat16", "float16"])
def test_load_transformers_checkpoint(tmp_path: Path, hf_llama: Any, shard: str | None, torch_dtype: str) -> None:
    m = hf_llama.to(getattr(torch, torch_dtype))
    kwargs = {} if shard is None else {"max_shard_size": shard}
    m.save_pretrained(tmp_path, **kwargs)
    hf_llama.to(torch.float32)
    assert (tmp_path / INDEX_NAME).exists() == (shard is not None)
    if shard is not None:
        assert len(list(tmp_path.glob("model-*-of-*.safetensors"))) > 1
    oracle = _oracle(tmp_path)
    got = load_checkpoint_tensors(tmp_path)
    assert set(got) == set(oracle)
    for name, ref in oracle.items():
        t = got[name]
        assert t.dtype.name == torch_dtype and t.shape == tuple(ref.shape), name
        np.testing.assert_array_equal(_bits(t), _torch_bits(ref))
    # dtype=float32 converts exactly as torch does (bf16 and f16 widen exactly)
    wide = load_checkpoint_tensors(tmp_path, dtype=kael.float32)
    for name, ref in oracle.items():
        assert wide[name].dtype is kael.float32
        np.testing.assert_array_equal(wide[name].numpy(), ref.float().numpy())
    entries = read_checkpoint_entries(tmp_path)
    assert {n: e.shape for n, e in entries.items()} == {n: tuple(r.shape) for n, r in oracle.items()}


def test_float32_to_bfloat16_rounds_as_torch(tmp_path: Path) -> None:
    x = torch.randn(257, generator=torch.Generator().manual_seed(1)) * 1000
    x[:4] = torch.tensor([0.0, -0.0, float("inf"), 1.0 + 2**-8])  # a tie: rounds to even
    safetensors_torch.save_file({"w": x}, str(tmp_path / SINGLE_NAME), metadata={"format": "pt"})
    got = load_checkpoint_tensors(tmp_path, dtype="bfloat16")["w"]
    np.testing.assert_array_equal(_bits(got), _torch_bits(x.to(torch.bfloat16)))


def test_mmap_load_equals_copy_load(tmp_path: Path, hf_llama: Any) -> None:
    hf_llama.save_pretrained(tmp_path, max_shard_size="50KB")
    copied = load_checkpoint_tensors(tmp_path)
    mapped = load_checkpoint_tensors(tmp_path, mmap=True)
    for name, t in copied.items():
        np.testing.assert_array_equal(mapped[name].numpy(), t.numpy())


def test_expected_shapes_pass_and_optional_may_be_absent(tmp_path: Path, hf_llama: Any) -> None:
    hf_llama.save_pretrained(tmp_path, max_shard_size="50KB")
    shapes = {n: tuple(p.shape) for n, p in hf_llama.state_dict().items()}
    got = load_checkpoint_tensors(tmp_path, expected=shapes, optional=["model.rotary_emb.inv_freq"])
    assert set(got) == set(shapes)
    # lm_head optional and present, a never-present optional name: both fine
    del shapes["lm_head.weight"]
    got = load_checkpoint_tensors(tmp_path, expected=shapes, optional=["lm_head.weight", "x.absent"])
    assert "lm_head.weight" in got


# -- expectations --------------------------------------------------------------------------------


def _simple(tmp_path: Path, **tensors: kael.Tensor) -> Path:
    save_checkpoint_tensors(tmp_path, tensors)
    return tmp_path


def test_missing_tensor_is_named(tmp_path: Path) -> None:
    d = _simple(tmp_path, a=kael.zeros(2))
    with pytest.raises(kael.FormatError, match=r"missing tensor\(s\) \['b'\]"):
        load_checkpoint_tensors(d, expected={"a": (2,), "b": (3,)})


def test_unexpected_tensor_is_named(tmp_path: Path) -> None:
    d = _simple(tmp_path, a=kael.zeros(2), extra=kael.zeros(1))
    with pytest.raises(kael.FormatError, match=r"unexpected tensor\(s\) \['extra'\]"):
        load_checkpoint_tensors(d, expected={"a": (2,)})
    assert set(load_checkpoint_tensors(d, expected={"a": (2,)}, optional={"extra"})) == {"a", "extra"}


def test_shape_mismatch_is_named(tmp_path: Path) -> None:
    d = _simple(tmp_path, a=kael.zeros(2, 3))
    with pytest.raises(kael.FormatError, match=r"'a' in 'model.safetensors' has shape \[2, 3\], expected \[3, 2\]"):
        load_checkpoint_tensors(d, expected={"a": (3, 2)})


def test_integer_weight_is_refused(tmp_path: Path) -> None:
    d = _simple(tmp_path, a=kael.zeros(2, dtype=kael.int32))
    with pytest.raises(kael.FormatError, match="has dtype int32, expected float32, float16, bfloat16"):
        load_checkpoint_tensors(d, expected={"a": (2,)})


def test_non_floating_target_dtype_is_refused(tmp_path: Path) -> None:
    d = _simple(tmp_path, a=kael.zeros(2))
    with pytest.raises(kael.DTypeError, match="floating-point"):
        load_checkpoint_tensors(d, dtype=kael.int64)


def test_integer_tensors_keep_their_dtype_under_conversion(tmp_path: Path) -> None:
    d = _simple(tmp_path, a=kael.ones(2), i=kael.arange(3))
    got = load_checkpoint_tensors(d, dtype=kael.float16)
    assert got["a"].dtype is kael.float16 and got["i"].dtype is kael.int64
    np.testing.assert_array_equal(got["i"].numpy(), [0, 1, 2])


# -- malformed directories: one test per rule ------------------------------------------------------


def _sharded(tmp_path: Path) -> Path:
    """A checkpoint of three tensors in three shards."""
    names = save_checkpoint_tensors(
        tmp_path, {"a": kael.ones(16), "b": kael.zeros(16), "c": kael.full((16,), 2.0)}, max_shard_size=64
    )
    assert names[-1] == INDEX_NAME and len(names) == 4
    return tmp_path


def _index(d: Path) -> dict[str, Any]:
    out: dict[str, Any] = json.loads((d / INDEX_NAME).read_text())
    return out


def _write_index(d: Path, obj: Any) -> None:
    (d / INDEX_NAME).write_text(obj if isinstance(obj, str) else json.dumps(obj))


def test_not_a_directory(tmp_path: Path) -> None:
    with pytest.raises(kael.FormatError, match="not a directory"):
        load_checkpoint_tensors(tmp_path / "nope")


def test_no_weights(tmp_path: Path) -> None:
    with pytest.raises(kael.FormatError, match=f"neither {SINGLE_NAME} nor {INDEX_NAME}"):
        load_checkpoint_tensors(tmp_path)


@pytest.mark.parametrize(
    "text, rule",
    [
        ("{not json", "index JSON"),
        ("[1, 2]", "must be a JSON object"),
        ('{"metadata": {}}', "weight_map: expected an object"),
        ('{"weight_map": [1]}', "weight_map: expected an object"),
        ('{"weight_map": {}}', "names no tensors"),
        ('{"weight_map": {"a": "x.safetensors", "a": "y.safetensors"}}', "duplicate key"),
        ('{"weight_map": {"a": 7}}', "must be a string"),
        ('{"metadata": 3, "weight_map": {"a": "x"}}', "metadata: expected an object"),
    ],
)
def test_malformed_index(tmp_path: Path, text: str, rule: str) -> None:
    d = _sharded(tmp_path)
    _write_index(d, text)
    with pytest.raises(kael.FormatError, match=rule) as info:
        load_checkpoint_tensors(d)
    assert INDEX_NAME in str(info.value)


def test_index_not_utf8(tmp_path: Path) -> None:
    d = _sharded(tmp_path)
    (d / INDEX_NAME).write_bytes(b'{"weight_map": {"\xff": "x"}}')
    with pytest.raises(kael.FormatError, match="UTF-8"):
        load_checkpoint_tensors(d)


@pytest.mark.parametrize(
    "bad", ["../model-00001-of-00003.safetensors", "/etc/passwd", "sub/x.safetensors", "..", "", "a\\b", "a\0b"]
)
def test_shard_names_must_be_plain(tmp_path: Path, bad: str) -> None:
    d = _sharded(tmp_path)
    idx = _index(d)
    idx["weight_map"]["a"] = bad
    _write_index(d, idx)
    with pytest.raises(kael.FormatError, match="must be a plain file name inside the checkpoint directory"):
        load_checkpoint_tensors(d)


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ("s" * 256 + ".safetensors", r"is 268 bytes long; a file name holds at most 255"),
        ("\u00e9" * 128, r"is 256 bytes long"),
        ("x\ud800.safetensors", r"lone surrogate"),
    ],
)
def test_shard_names_must_fit_a_file_name(tmp_path: Path, bad: str, message: str) -> None:
    d = _sharded(tmp_path)
    idx = _index(d)
    idx["weight_map"]["a"] = bad
    _write_index(d, idx)
    with pytest.raises(kael.FormatError, match=message):
        load_checkpoint_tensors(d)
    with pytest.raises(kael.FormatError, match=message):
        read_checkpoint_entries(d)


def test_longest_plain_shard_name_is_looked_up(tmp_path: Path) -> None:
    d = _sharded(tmp_path)
    idx = _index(d)
    idx["weight_map"]["a"] = "y" * 255
    _write_index(d, idx)
    with pytest.raises(kael.FormatError, match=r"missing shard.*does not exist"):
        load_checkpoint_tensors(d)


def test_missing_shard(tmp_path: Path) -> None:
    d = _sharded(tmp_path)
    (d / "model-00002-of-00003.safetensors").unlink()
    with pytest.raises(kael.FormatError, match=r"missing shard.*model-00002-of-00003\.safetensors"):
        load_checkpoint_tensors(d)


def test_indexed_tensor_missing_from_its_shard(tmp_path: Path) -> None:
    d = _sharded(tmp_path)
    idx = _index(d)
    idx["weight_map"]["ghost"] = "model-00001-of-00003.safetensors"
    _write_index(d, idx)
    with pytest.raises(kael.FormatError, match=r"model-00001-of-00003.safetensors.*tensor 'ghost': missing tensor"):
        load_checkpoint_tensors(d)


def test_shard_tensor_not_in_index(tmp_path: Path) -> None:
    d = _sharded(tmp_path)
    kael.save_safetensors({"b": kael.zeros(16), "stray": kael.zeros(1)}, d / "model-00002-of-00003.safetensors")
    with pytest.raises(kael.FormatError, match=r"model-00002-of-00003.*tensor 'stray': not in index"):
        load_checkpoint_tensors(d)


def test_duplicate_across_shards(tmp_path: Path) -> None:
    d = _sharded(tmp_path)
    kael.save_safetensors({"a": kael.ones(16), "b": kael.zeros(16)}, d / "model-00002-of-00003.safetensors")
    with pytest.raises(kael.FormatError, match=r"tensor 'a': (duplicate tensor|wrong shard)"):
        load_checkpoint_tensors(d)


def test_tensor_in_another_shard_than_indexed(tmp_path: Path) -> None:
    d = _sharded(tmp_path)
    idx = _index(d)
    idx["weight_map"]["a"], idx["weight_map"]["b"] = idx["weight_map"]["b"], idx["weight_map"]["a"]
    _write_index(d, idx)
    with pytest.raises(kael.FormatError, match=r"model-00001-of-00003.*tensor 'a': wrong shard"):
        load_checkpoint_tensors(d)


def test_corrupt_shard_header_names_the_shard(tmp_path: Path) -> None:
    d = _sharded(tmp_path)
    (d / "model-00003-of-00003.safetensors").write_bytes(struct.pack("<Q", 2) + b"[]")
    with pytest.raises(kael.FormatError, match=r"model-00003-of-00003\.safetensors.*header start"):
        load_checkpoint_tensors(d)


def test_validation_happens_before_reading_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import kael.io._checkpoint as ck

    d = _simple(tmp_path, a=kael.zeros(4))
    calls: list[Any] = []
    monkeypatch.setattr(ck, "load_arrays", lambda *a, **k: calls.append(a))
    with pytest.raises(kael.FormatError):
        load_checkpoint_tensors(d, expected={"a": (5,)})
    assert calls == []


# -- writing -------------------------------------------------------------------------------------


def test_saved_shards_load_in_transformers(tmp_path: Path, hf_llama: Any) -> None:
    state = {n: kael.tensor(p.detach().numpy()) for n, p in hf_llama.state_dict().items()}
    names = save_checkpoint_tensors(tmp_path, state, max_shard_size="50KB")
    assert len(names) > 2 and names[-1] == INDEX_NAME
    idx = _index(tmp_path)
    assert idx["metadata"]["total_size"] == sum(t.nbytes for t in state.values())
    assert set(idx["weight_map"]) == set(state) and set(idx["weight_map"].values()) == set(names[:-1])
    for shard in names[:-1]:  # every shard within the limit (no single tensor is larger here)
        assert (
            sum(v.numel() * v.element_size() for v in safetensors_torch.load_file(str(tmp_path / shard)).values())
            <= 50_000
        )
    _llama_config().save_pretrained(tmp_path)
    loaded = transformers.LlamaForCausalLM.from_pretrained(tmp_path).eval()
    for name, p in loaded.state_dict().items():
        np.testing.assert_array_equal(p.numpy(), hf_llama.state_dict()[name].numpy(), err_msg=name)
    ids = torch.tensor([[1, 5, 9, 3]])
    with torch.no_grad():  # equal weights; the attention kernel transformers picks may round differently
        np.testing.assert_allclose(loaded(ids).logits.numpy(), hf_llama(ids).logits.numpy(), rtol=0, atol=1e-5)


def test_save_switches_layouts_without_stale_files(tmp_path: Path) -> None:
    tensors = {"a": kael.ones(64), "b": kael.zeros(64)}
    save_checkpoint_tensors(tmp_path, tensors, max_shard_size=256)
    assert sorted(os.listdir(tmp_path)) == sorted(
        [INDEX_NAME, "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    )
    save_checkpoint_tensors(tmp_path, tensors)
    assert os.listdir(tmp_path) == [SINGLE_NAME]
    save_checkpoint_tensors(tmp_path, tensors, max_shard_size="0.256kB")
    assert SINGLE_NAME not in os.listdir(tmp_path)
    got = load_checkpoint_tensors(tmp_path)
    np.testing.assert_array_equal(got["a"].numpy(), np.ones(64, np.float32))


def test_bad_save_writes_nothing(tmp_path: Path) -> None:
    d = tmp_path / "out"
    with pytest.raises(kael.FormatError, match="expected a kael Tensor"):
        save_checkpoint_tensors(d, {"a": kael.ones(2), "b": np.ones(2)})  # type: ignore[dict-item]
    with pytest.raises(kael.FormatError, match="reserved"):
        save_checkpoint_tensors(d, {"a": kael.ones(2), "__metadata__": kael.ones(2)}, max_shard_size=8)
    with pytest.raises(kael.FormatError, match="no tensors"):
        save_checkpoint_tensors(d, {})
    with pytest.raises(kael.FormatError, match="__metadata__"):
        save_checkpoint_tensors(d, {"a": kael.ones(2)}, metadata={"format": 1})  # type: ignore[dict-item]
    assert not d.exists()


@pytest.mark.parametrize(
    "size, n",
    [(10, 10), ("50KB", 50_000), ("2GiB", 2**31), ("1.5MB", 1_500_000), ("7", 7), ("3 kib", 3072)],
)
def test_parse_size(size: int | str, n: int) -> None:
    assert parse_size(size) == n


@pytest.mark.parametrize("size", [0, -1, "", "5 parsecs", "GB", True, 1.5, "0KB"])
def test_bad_sizes(size: Any) -> None:
    with pytest.raises(kael.FormatError, match="max_shard_size"):
        parse_size(size)


_DTYPES = [kael.float32, kael.float16, kael.bfloat16, kael.int64, kael.uint8]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    specs=st.lists(
        st.tuples(st.sampled_from(_DTYPES), st.lists(st.integers(0, 5), max_size=3)), min_size=1, max_size=6
    ),
    limit=st.integers(1, 200),
)
def test_round_trip_property(tmp_path_factory: pytest.TempPathFactory, specs: list[Any], limit: int) -> None:
    d = tmp_path_factory.mktemp("ck")
    rng = np.random.default_rng(0)
    tensors = {}
    for i, (dtype, shape) in enumerate(specs):
        values = rng.integers(0, 200, size=tuple(shape)).astype(np.float64)
        tensors[f"t{i}"] = kael.tensor(values, dtype=dtype)
    names = save_checkpoint_tensors(d, tensors, max_shard_size=limit)
    sizes = [t.nbytes for t in tensors.values()]
    assert (len(names) == 1) == (sum(sizes) <= limit or len(sizes) == 1)
    got = load_checkpoint_tensors(d)
    assert set(got) == set(tensors)
    for name, t in tensors.items():
        assert got[name].dtype is t.dtype and got[name].shape == t.shape
        np.testing.assert_array_equal(_bits(got[name]), _bits(t))
    oracle = _oracle(d)
    assert set(oracle) == set(tensors)


# -- GPT-2 reads sharded checkpoints through load_checkpoint_tensors ---------------------------------


def test_gpt2_loads_sharded_transformers_checkpoint(tmp_path: Path) -> None:
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(
        vocab_size=128, n_positions=32, n_embd=32, n_layer=2, n_head=4, bos_token_id=5, eos_token_id=[5, 7]
    )
    hf = transformers.GPT2LMHeadModel(cfg).eval()
    hf.save_pretrained(tmp_path, max_shard_size="40KB")
    assert (tmp_path / INDEX_NAME).exists() and not (tmp_path / SINGLE_NAME).exists()
    m = kael.models.from_pretrained(tmp_path)
    assert m.generation_config is not None and m.generation_config.eos_token_ids == (5, 7)  # type: ignore[attr-defined]
    ids = [[3, 1, 4, 1, 5, 9]]
    with torch.no_grad():
        want = hf(torch.tensor(ids)).logits.numpy()
    got = m(kael.tensor(ids)).detach().numpy()
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-4)
