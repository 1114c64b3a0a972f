"""Granite GGUF files (kael/models/_gguf_llama.py, architecture ``granite``): llama.cpp's converter output of a
random transformers Granite checkpoint (``convert_hf_to_gguf.py --outtype f32``, found through
tests/llama_cpp_tools.py; skipped without it) loads as a ``GraniteForCausalLM`` with its four scales
(``granite.embedding_scale``, ``residual_scale``, ``attention.scale``, ``logit_scale``), the checkpoint's
tokenizer and transformers' logits; ``llama-quantize``'s Q8_0 of that file loads with its bytes and the logits
kael's own Q8_0 gives; kael's ``save_gguf`` writes a ``granite`` file that reads back the same and that
llama.cpp (the ``llama_cpp`` package) runs with the same logits.

Oracles: transformers' GraniteForCausalLM on the checkpoint, kael's ``from_pretrained`` of the checkpoint (F32
and ``weights="q8_0"``: the same GGML Q8_0 bytes as llama-quantize writes), and llama.cpp.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import family_gguf as fg
import kael
import pytest
from gguf_models_common import rewrite
from granite_checkpoints import MULTIPLIERS, SHAPES, build
from kael.models import from_pretrained, load_gguf, save_gguf
from kael.models.granite import GraniteForCausalLM

pytest.importorskip("gguf")
torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

#: The GGUF keys of the four multipliers (llama.cpp's converter: GraniteModel.set_gguf_parameters).
KEYS = {
    "embedding_multiplier": "granite.embedding_scale",
    "residual_multiplier": "granite.residual_scale",
    "attention_multiplier": "granite.attention.scale",
    "logits_scaling": "granite.logit_scale",
}
# Q8_0 against transformers' float32 logits (test_qwen3_gguf's reasoning), relative to the largest |logit| (the
# untied shape's logits_scaling 0.5 doubles them). Measured over seeds 4 to 6: max |diff| / max |logit| 0.015 to
# 0.065, top-1 agreement 0.94 to 1.0; the bounds leave margin. The exact check is against kael's own Q8_0 of the
# checkpoint (the same bytes).
Q8_0_TOLERANCE = (0.1, 0.9)

checkpoint = fg.checkpoint_fixture("granite", SHAPES, build)


def _scales(f: Any, hf: Any) -> None:
    assert {k: f.metadata[key] for k, key in KEYS.items()} == pytest.approx(
        {k: getattr(hf.config, k) for k in MULTIPLIERS}
    )


def _multipliers(model: Any, hf: Any) -> None:
    assert {k: getattr(model.config, k) for k in MULTIPLIERS} == {k: getattr(hf.config, k) for k in MULTIPLIERS}


def _saved_scales(f: Any, model: Any, hf: Any) -> None:
    _scales(f, hf)


def test_converter_f32_file_matches_transformers(checkpoint: fg.Checkpoint) -> None:
    fg.check_converter_f32(checkpoint, "granite", GraniteForCausalLM, _scales, _multipliers)


def test_llama_quantize_q8_0_file(checkpoint: fg.Checkpoint) -> None:
    fg.check_llama_quantize_q8_0(checkpoint, GraniteForCausalLM, Q8_0_TOLERANCE, relative=True)


def test_save_gguf_round_trip(checkpoint: fg.Checkpoint, tmp_path: Path) -> None:
    fg.check_save_gguf_round_trip(checkpoint, tmp_path, "granite", GraniteForCausalLM, _saved_scales)


def test_llama_cpp_runs_kaels_file_with_the_same_logits(checkpoint: fg.Checkpoint, tmp_path: Path) -> None:
    fg.check_llama_cpp_runs(checkpoint, tmp_path, "granite")


@pytest.mark.parametrize("key", list(KEYS.values()))
def test_a_granite_file_without_a_scale_is_refused_naming_it(
    checkpoint: tuple[Path, Any], tmp_path: Path, key: str
) -> None:
    d, _ = checkpoint
    path = tmp_path / "kael-granite.gguf"
    save_gguf(from_pretrained(d), path)
    bad = rewrite(path, tmp_path / "bad.gguf", meta={key: None})
    with pytest.raises(kael.FormatError, match=f"missing metadata key '{key}'"):
        load_gguf(bad)


def test_llama_cpp_agrees_on_the_q8_0_file(checkpoint: fg.Checkpoint, monkeypatch: pytest.MonkeyPatch) -> None:
    fg.check_llama_cpp_agrees_on_q8_0(checkpoint, monkeypatch)
