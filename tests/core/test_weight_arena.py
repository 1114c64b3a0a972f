"""kael/models/_weight_arena.py (NOTE [weight arena]): a GGUF load moves its stored weights into one buffer, in
the order of ``model.modules()``, each at a 64-byte boundary, the fused q/k/v and gate/up buffers whole. Oracles:
the file's bytes as the ``gguf`` package reads them, and the same file loaded with ``mmap=True`` (weights left in
the file's mapping, never moved), whose logits the moved weights give bit for bit."""

from __future__ import annotations

from pathlib import Path

import kael
import numpy as np
import pytest
from gguf_models_common import export, logits_of
from hf_fixtures import write_llama3
from kael.models import load_gguf
from kael.models._weight_arena import WeightArena, gather_weights
from kael.tokenizer import load_tokenizer
from llama_checkpoints import build

gguf = pytest.importorskip("gguf")
pytest.importorskip("torch")
pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def llama_dir(root: Path) -> Path:
    d = root / "llama"
    write_llama3(d)
    build(d, "llama", vocab_size=load_tokenizer(d).vocab_size, tie_word_embeddings=False)
    return d


def _stored(model: object) -> list[tuple[str, kael.Tensor]]:
    return [
        (n, m.weight)
        for n, m in model.named_modules()  # type: ignore[attr-defined]
        if getattr(m, "scheme", None) is not None and isinstance(getattr(m, "weight", None), kael.Tensor)
    ]


def _address(t: kael.Tensor) -> int:
    return int(t._np_view().ctypes.data)


@pytest.mark.parametrize("weights", ["q8_0", "q4_0", "f16", "bf16"])
def test_a_gguf_load_lays_its_weights_out_in_module_order(llama_dir: Path, weights: str) -> None:
    path = export(llama_dir, weights)
    model, tok = load_gguf(path)
    stored = _stored(model)
    assert len(stored) >= 8
    # one buffer: each storage starts where the previous one's 64-byte room ends, in module order
    starts: dict[int, tuple[int, int]] = {}
    for _, w in stored:
        s = w.untyped_storage()
        starts.setdefault(id(s), (_address(w) - w.storage_offset() * w.element_size(), s.nbytes))
    spans = list(starts.values())
    for (a, n), (b, _) in zip(spans, spans[1:]):
        assert b == a + WeightArena.room(n)
    assert all(a % 64 == 0 for a, _ in spans)
    # the fused q/k/v of a layer are still views of one storage, back to back
    attn = model.model.layers[0].self_attn
    q, k, v = attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight
    assert q.untyped_storage() is k.untyped_storage() is v.untyped_storage()
    assert _address(k) == _address(q) + q.nbytes and _address(v) == _address(k) + k.nbytes
    # the bytes are the file's (o_proj: not permuted, not fused) and the logits those of the mapped file's
    reader = gguf.GGUFReader(str(path))
    o_file = next(t for t in reader.tensors if t.name == "blk.0.attn_output.weight")
    o = model.model.layers[0].self_attn.o_proj.weight
    np.testing.assert_array_equal(
        np.asarray(o._np_view()).view(np.uint8).reshape(-1), o_file.data.view(np.uint8).reshape(-1)
    )
    mapped, _ = load_gguf(path, mmap=True)
    ids = tok.encode("The arena keeps the bytes; 12 + 30 = 42.")
    np.testing.assert_array_equal(logits_of(model, ids), logits_of(mapped, ids))


def test_the_mapped_load_keeps_the_files_mapping(llama_dir: Path) -> None:
    path = export(llama_dir, "q8_0")
    mapped, _ = load_gguf(path, mmap=True)
    o = mapped.model.layers[0].self_attn.o_proj.weight
    where = _address(o)
    assert not o._np_view().flags.writeable  # the file's mapping, not moved by the loader
    gather_weights(mapped.modules())  # moves what it may (the fused buffers), never read-only memory
    assert _address(o) == where


def test_moved_weights_stay_writable(llama_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A copy-mode load's weights are ordinary tensors: a write reaches the logits (the arena is no copy; no
    repacked copy either, which a write through NumPy would not refresh)."""
    monkeypatch.setenv("KAEL_REPACK", "0")
    model, tok = load_gguf(export(llama_dir, "q8_0"))
    ids = tok.encode("write through")
    before = logits_of(model, ids)
    w = model.model.layers[1].mlp.down_proj.weight
    assert w._np_view().flags.writeable
    w._np_view()[:, :2] = 0  # every block's float16 scale: the layer's MLP output becomes 0
    assert not np.array_equal(logits_of(model, ids), before)


def test_a_load_without_mmap_owns_its_weights(llama_dir: Path, tmp_path: Path) -> None:
    """Without mmap the loader moves each stored weight from the file's mapping into the arena (one copy): the
    file overwritten afterwards changes nothing, and every stored weight is writable memory of the arena."""
    import shutil

    path = tmp_path / "model.gguf"
    shutil.copyfile(export(llama_dir, "q4_0"), path)
    model, tok = load_gguf(path)
    ids = tok.encode("owned bytes")
    before = logits_of(model, ids)
    with open(path, "r+b") as f:  # the same inode, every byte zero: a mapping would see it
        f.write(bytes(path.stat().st_size))
    assert all(w._np_view().flags.writeable for _, w in _stored(model))
    np.testing.assert_array_equal(logits_of(model, ids), before)


def test_an_arena_refuses_what_does_not_fit() -> None:
    arena = WeightArena(100)
    first = arena.place(np.arange(10, dtype=np.float32))
    np.testing.assert_array_equal(first, np.arange(10, dtype=np.float32))
    assert first.ctypes.data % (2 << 20) == 0
    with pytest.raises(kael.KaelError, match=r"WeightArena.place: 64 bytes do not fit \(36 left\)"):
        arena.place(np.zeros(16, np.float32))
