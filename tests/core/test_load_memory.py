"""A load's resident memory (NOTE [heap trim] in kael_backend_cpu's allocator.cpp, GGUFFile.release_pages,
kael.quantize's per-projection release): each model is loaded in a fresh Python process, which reports how much
anonymous memory the load added and how far its peak (VmHWM) rose above what it holds at the end. Oracle: the
file's size. Each bound fails on the loaders as they were before (the figures in each test's comment)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import kael
import pytest
from kael.models import GPT, LlamaConfig, LlamaForCausalLM, save_gguf, save_pretrained

pytestmark = [
    pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads RssAnon and VmHWM from /proc"),
    pytest.mark.skipif(not kael.cpu.memory_stats(), reason="the NumPy reference backend: no allocator, no trim"),
]

_RESIDENT = """
import json, sys
from kael.models import from_pretrained

def status(field):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field + ":"))

# A process that has freed one large buffer, as any has by the time it loads a model: glibc's mmap threshold
# rises to that size, so the loader's smaller copies come from the heap.
buf = bytearray(16 << 20)
del buf
before = status("RssAnon")
model = from_pretrained(sys.argv[1], weights=sys.argv[2] if len(sys.argv) > 2 else None)
print(json.dumps({"grew": status("RssAnon") - before, "peak_over_rss": status("VmHWM") - status("VmRSS")}))
"""


def _load_in_a_fresh_process(*args: str) -> dict[str, int]:
    r = subprocess.run([sys.executable, "-c", _RESIDENT, *args], capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stderr[-2000:]
    return dict(json.loads(r.stdout.strip().splitlines()[-1]))


def _llama(layers: int, vocab: int, intermediate: int, tied: bool = False) -> LlamaForCausalLM:
    kael.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=vocab, hidden_size=512, intermediate_size=intermediate, num_hidden_layers=layers,
        num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=tied,
    )  # fmt: skip
    return LlamaForCausalLM(cfg)


@pytest.mark.parametrize("source", ["gguf", "safetensors as q8_0"])
def test_a_load_keeps_the_weights_size_not_twice(tmp_path: Path, source: str) -> None:
    # The first copies of a GGUF load's weights, freed once they moved into the arena, used to stay on the C heap,
    # and the float32 weights from_pretrained(weights=) replaced in the CPU allocator's cache: a load held two to
    # three times its weights (105 MB for this 29 MB file). Oracle: the GGUF file's size (the q8_0 weights' bytes).
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
    out = _load_in_a_fresh_process(*args)
    assert out["grew"] < 1.15 * size + (8 << 20), (out, size)


def test_a_float32_load_peaks_at_its_weights(tmp_path: Path) -> None:
    # A float32 Llama file: each weight is copied once, from the file's mapping into its parameter, whose file
    # pages the loader then drops (GGUFFile.release_pages), and the fused q/k/v and gate/up buffers replace their
    # parts layer by layer. The peak was the file's mapped pages, the weights and every layer's fused copies at
    # once (2.7x the file), then the mapped pages and the weights (2.1x); now the weights and a few pages.
    path = tmp_path / "llama-f32.gguf"
    save_gguf(_llama(8, 1024, 1536), path)
    size = path.stat().st_size
    assert size > 25 << 20
    out = _load_in_a_fresh_process(str(path))
    assert out["grew"] < 1.15 * size + (8 << 20), (out, size)  # the weights, once
    assert out["peak_over_rss"] < 0.25 * size + (16 << 20), (out, size)  # no file's worth of pages at once


def test_quantizing_at_load_peaks_near_the_float_model(tmp_path: Path) -> None:
    # from_pretrained(weights="q8_0") of a float checkpoint with a big token table: each projection's float weight
    # goes back to the system once quantized, and quantize_array takes a slab of rows at a time. The peak was the
    # float model, every float weight the CPU allocator cached and the table's quantizer temporaries (6x the
    # file); now about the float model.
    _llama(2, 32768, 1024, tied=True).save_pretrained(tmp_path / "hf")
    size = (tmp_path / "hf" / "model.safetensors").stat().st_size
    assert size > 64 << 20
    out = _load_in_a_fresh_process(str(tmp_path / "hf"), "q8_0")
    assert out["grew"] < 0.4 * size, (out, size)  # q8_0: 34 bytes per 32 float32 weights
    assert out["peak_over_rss"] < 2 * size, (out, size)


def test_a_quantized_llama_load_peaks_below_twice_its_file(tmp_path: Path) -> None:
    # Q8_0: the fused q/k/v and gate/up buffers are copies of the file's parts; the loader drops the file's pages
    # it read for them, and gives each fused buffer back as it moves into the arena (it kept them all, and every
    # page read, until the end: 1.3x the file over the loaded model; now under 0.9x).
    path = tmp_path / "llama-q8_0.gguf"
    save_gguf(_llama(16, 1024, 1536), path, weights="q8_0")
    size = path.stat().st_size
    out = _load_in_a_fresh_process(str(path))
    assert out["grew"] < 1.15 * size + (8 << 20), (out, size)
    assert out["peak_over_rss"] < 0.9 * size, (out, size)
