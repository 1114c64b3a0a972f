"""What the tests/core/test_gguf_models*.py and test_gguf_llama_cpp.py files share: a sample text,
the weight schemes kael exports, the bundled kael-tiny-chat checkpoint's directory, a random GPT-2
checkpoint with GPT-2's real vocabulary (``write_random_gpt2``), a model's logits without gradients
(``logits_of``), a checkpoint exported to GGUF once per scheme (``export``, cached beside the
checkpoint) and a GGUF file rewritten with changed metadata or tensors (``rewrite``), and
the script that runs llama.cpp's converter on a test tokenizer (``CONVERT``).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import kael
import numpy as np
from hf_fixtures import GPT2_DATA
from kael.models import from_pretrained, save_gguf
from kael.tokenizer import load_tokenizer

__all__ = ["CONVERT", "KAEL_TINY_CHAT", "SCHEMES", "TEXT", "export", "logits_of", "rewrite", "write_random_gpt2"]

SCHEMES = (None, "f16", "bf16", "q8_0", "q4_0")
TEXT = "The quick brown fox, 12345 apples; it's <|endoftext|> done."
KAEL_TINY_CHAT = (
    Path(__file__).resolve().parents[2] / "kael_server" / "src" / "kael_server" / "models" / "kael-tiny-chat"
)


#: ``python -c CONVERT LLAMA_CPP_SOURCE PRE_TOKENIZER CONVERTER_ARGS...``: llama.cpp's convert_hf_to_gguf.py
#: with the pre-tokenizer named (its hash table does not know the test tokenizers).
CONVERT = """
import sys
root, pre = sys.argv[1], sys.argv[2]
sys.path[:0] = [root, root + "/gguf-py"]
import convert_hf_to_gguf as c
try:
    import conversion.base as b
except ImportError:
    b = c
# llama.cpp names a tokenizer's pre-tokenizer by hashing known tokenizers' output; these test
# tokenizers are not in its table, so the test tells it which split they use.
b.TextModel.get_vocab_base_pre = lambda self, tokenizer: pre
sys.argv = ["convert_hf_to_gguf.py", *sys.argv[3:]]
c.main()
"""


def logits_of(model: Any, ids: list[int]) -> np.ndarray:
    """The model's logits on one sequence ``ids``, computed without gradients, as a NumPy array."""
    with kael.no_grad():
        return np.asarray(model(kael.tensor([ids]))._host()[0])


def write_random_gpt2(d: Path) -> Path:
    """A random GPT-2 (2 layers, 64 wide) with GPT-2's real vocabulary, saved in ``d`` (n_positions 1024:
    transformers' GGUF loader does not read gpt2.context_length into n_positions)."""
    import torch
    import transformers

    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_embd=64, n_layer=2, n_head=2, n_positions=1024, vocab_size=50257)
    transformers.GPT2LMHeadModel(cfg).eval().save_pretrained(d)
    for name in ("vocab.json", "merges.txt"):
        shutil.copy(GPT2_DATA / name, d / name)
    return d


def export(directory: Path, weights: str | None) -> Path:
    """The checkpoint in ``directory`` saved as GGUF with ``weights`` (written once, then reused)."""
    path = directory / f"model-{weights or 'f32'}.gguf"
    if not path.exists():
        save_gguf(from_pretrained(directory), path, load_tokenizer(directory), weights=weights)
    return path


def rewrite(
    src: Path,
    dst: Path,
    *,
    meta: dict[str, Any] | None = None,
    drop: tuple[str, ...] = (),
    add: list[tuple[str, str, tuple[int, ...], np.ndarray]] | None = None,
    replace: dict[str, tuple[str, tuple[int, ...], np.ndarray]] | None = None,
) -> Path:
    """``src`` written to ``dst`` with metadata keys changed (None removes one), tensors dropped, added or
    replaced."""
    with kael.io.read_gguf(src) as f:
        metadata: dict[str, Any] = {
            k: kael.io.GGUFValue(f.metadata_types[k], v)
            for k, v in f.metadata.items()
            if not k.startswith("general.alignment")
        }
        for k, v in (meta or {}).items():
            if v is None:
                metadata.pop(k, None)
            else:
                metadata[k] = v
        tensors = []
        for name, t in f.tensors.items():
            if name in drop:
                continue
            if replace and name in replace:
                kind, shape, data = replace[name]
                tensors.append((name, kind, shape, data))
            else:
                tensors.append((name, t.type, t.shape, np.array(t.data)))
        tensors += add or []
        kael.io.write_gguf(dst, metadata, tensors)
    return dst
