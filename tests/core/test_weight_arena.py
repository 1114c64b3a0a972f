"""kael/models/_weight_arena.py (NOTE [weight arena]): a GGUF load moves its stored weights into one buffer, in
the order of ``model.modules()``, each at a 64-byte boundary, the fused q/k/v and gate/up buffers whole. Oracles:
the file's bytes as the ``gguf`` package reads them, and the same file loaded with ``mmap=True`` (weights left in
the file's mapping, never moved), whose logits the moved weights give bit for bit; and the file's size, which a
load's resident memory stays close to (NOTE [heap trim])."""

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


_RESIDENT = """
import json, sys
from kael.models import from_pretrained

def anon():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("RssAnon:"))

# A process that has freed one large buffer, as any has by the time it loads a model: glibc's mmap threshold
# rises to that size, so the loader's smaller copies come from the heap.
buf = bytearray(16 << 20)
del buf
before = anon()
model = from_pretrained(sys.argv[1], weights=sys.argv[2] if len(sys.argv) > 2 else None)
with open("/proc/self/status") as f:
    peak = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))
with open("/proc/self/status") as f:
    rss = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))
print(json.dumps({"grew": anon() - before, "peak_over_rss": peak - rss}))
"""


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads RssAnon from /proc")
@pytest.mark.parametrize("source", ["gguf", "safetensors as q8_0"])
def test_a_load_keeps_the_weights_size_not_twice(tmp_path: Path, source: str) -> None:
    # The first copies of a GGUF load's weights, freed once they moved into the arena, used to stay on the C heap
    # (NOTE [heap trim] in kael_backend_cpu's allocator.cpp), and the float32 weights from_pretrained(weights=)
    # replaced in the CPU allocator's cache: a load held two to three times its weights. Oracle: the GGUF file's
    # size (the q8_0 weights' bytes).
    import json
    import subprocess
    import sys

    from kael.models import GPT, save_gguf, save_pretrained

    if not kael.cpu.memory_stats():
        pytest.skip("the NumPy reference backend serves cpu: no allocator, no trim")
    kael.manual_seed(0)
    model = GPT(vocab_size=4096, max_positions=64, layers=8, heads=8, dimension=512)
    path = tmp_path / "gpt2-q8_0.gguf"
    save_gguf(model, path, weights="q8_0")
    size = path.stat().st_size
    assert size > 25 << 20
    args = [str(path)]
    if source != "gguf":
        save_pretrained(model, tmp_path / "hf")
        args = [str(tmp_path / "hf"), "q8_0"]
    r = subprocess.run([sys.executable, "-c", _RESIDENT, *args], capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stderr[-2000:]
    grew = json.loads(r.stdout.strip().splitlines()[-1])["grew"]
    assert grew < 1.15 * size + (8 << 20), (grew, size)


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads VmHWM from /proc")
def test_a_float32_load_peaks_at_its_weights() -> None:
    # A float32 Llama file: each weight is copied once, from the file's mapping into its parameter, whose file
    # pages the loader then drops (GGUFFile.release_pages), and the fused q/k/v and gate/up buffers replace their
    # parts layer by layer. The peak was the file's mapped pages, the weights and every layer's fused copies at
    # once (2.7x the file), then the mapped pages and the weights (2.1x); now the weights and a few pages.
    import json
    import subprocess
    import sys
    import tempfile

    from kael.models import LlamaConfig, LlamaForCausalLM, save_gguf

    if not kael.cpu.memory_stats():
        pytest.skip("the NumPy reference backend serves cpu: no allocator, no trim")
    kael.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=1024, hidden_size=512, intermediate_size=1536, num_hidden_layers=8, num_attention_heads=8,
        num_key_value_heads=2, max_position_embeddings=64,
    )  # fmt: skip
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "llama-f32.gguf"
        save_gguf(LlamaForCausalLM(cfg), path)
        size = path.stat().st_size
        assert size > 25 << 20
        r = subprocess.run([sys.executable, "-c", _RESIDENT, str(path)], capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["grew"] < 1.15 * size + (8 << 20), (out, size)  # the weights, once
    assert out["peak_over_rss"] < 0.25 * size + (16 << 20), (out, size)  # no file's worth of pages at once


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads VmHWM from /proc")
def test_quantizing_at_load_peaks_near_the_float_model(tmp_path: Path) -> None:
    # from_pretrained(weights="q8_0") of a float checkpoint with a big token table: each projection's float weight
    # goes back to the system once quantized, and quantize_array takes a slab of rows at a time. The peak was the
    # float model, every float weight the CPU allocator cached and the table's quantizer temporaries (6x the
    # file); now about the float model. Oracle: the checkpoint's size.
    import json
    import subprocess
    import sys

    from kael.models import LlamaConfig, LlamaForCausalLM

    if not kael.cpu.memory_stats():
        pytest.skip("the NumPy reference backend serves cpu: no allocator, no trim")
    kael.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=32768, hidden_size=512, intermediate_size=1024, num_hidden_layers=2, num_attention_heads=8,
        num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=True,
    )  # fmt: skip
    LlamaForCausalLM(cfg).save_pretrained(tmp_path / "hf")
    size = (tmp_path / "hf" / "model.safetensors").stat().st_size
    assert size > 64 << 20
    cmd = [sys.executable, "-c", _RESIDENT, str(tmp_path / "hf"), "q8_0"]
    r = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["grew"] < 0.4 * size, (out, size)  # q8_0: 34 bytes per 32 float32 weights, and the tokenizer-free rest
    assert out["peak_over_rss"] < 2 * size, (out, size)


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads VmHWM from /proc")
def test_a_quantized_llama_load_peaks_below_twice_its_file(tmp_path: Path) -> None:
    # Q8_0: the fused q/k/v and gate/up buffers are copies of the file's parts; the loader drops the file's pages
    # it read for them, and gives each fused buffer back as it moves into the arena (it kept them all, and every
    # page read, until the end: 1.3x the file over the loaded model; now under 0.9x). Oracle: the file's size.
    import json
    import subprocess
    import sys

    from kael.models import LlamaConfig, LlamaForCausalLM, save_gguf

    if not kael.cpu.memory_stats():
        pytest.skip("the NumPy reference backend serves cpu: no allocator, no trim")
    kael.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=1024, hidden_size=512, intermediate_size=1536, num_hidden_layers=16, num_attention_heads=8,
        num_key_value_heads=2, max_position_embeddings=64,
    )  # fmt: skip
    path = tmp_path / "llama-q8_0.gguf"
    save_gguf(LlamaForCausalLM(cfg), path, weights="q8_0")
    size = path.stat().st_size
    r = subprocess.run([sys.executable, "-c", _RESIDENT, str(path)], capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["grew"] < 1.15 * size + (8 << 20), (out, size)
    assert out["peak_over_rss"] < 0.9 * size, (out, size)
