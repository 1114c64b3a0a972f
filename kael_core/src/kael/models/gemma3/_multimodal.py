"""Gemma 3's multimodal checkpoints (``model_type`` ``"gemma3"``): their text model, loaded as ``Gemma3ForCausalLM``.

Gemma 3 4B, 12B and 27B ship as Hugging Face ``Gemma3ForConditionalGeneration`` checkpoints: a SigLIP vision
tower and a projector (``vision_config``) beside the Gemma 3 text model (``text_config``, a ``Gemma3TextConfig``'s
fields, often only those that differ from its defaults). kael serves text: it loads the text model as the
``gemma3_text`` family's ``Gemma3ForCausalLM`` (same weights, same logits on text as transformers'
``Gemma3ForConditionalGeneration``) and does not load the vision tower or the projector (an INFO log line says
how many tensors it leaves; kael-server refuses image parts in a chat message).

NOTE [gemma3 multimodal checkpoint]: what ``read_multimodal_config`` and ``multimodal_layout`` read:

* ``config.json``: ``model_type`` "gemma3" and a ``text_config`` object (a FormatError when it is missing:
  every checkpoint Google or transformers writes has one); the fields it leaves out are ``Gemma3TextConfig``'s
  defaults (``TEXT_CONFIG_DEFAULTS``, and the defaults the gemma3_text reader already has). The top level's
  ``tie_word_embeddings`` (default true) decides the tie, as transformers' ``Gemma3ForConditionalGeneration``
  ties by its own config; its ``bos/eos/pad_token_id`` and ``dtype``, when present, are the text model's.
  ``vision_config`` and the image token ids are not read.
* the weights, under one of two key layouts: transformers 4.50 and 4.51 (and 5.x's ``save_pretrained``, which
  converts back to it) write ``language_model.model.*``, ``language_model.lm_head.weight`` (absent when tied),
  ``vision_tower.*`` and ``multi_modal_projector.*``; transformers 4.52 and later 4.x write
  ``model.language_model.*``, ``lm_head.weight``, ``model.vision_tower.*`` and ``model.multi_modal_projector.*``.
  The text tensors are checked and read as the Llama loader checks a gemma3_text checkpoint's (a missing or
  misshapen one is a FormatError naming the stored key); the vision ones are neither checked nor read.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from ..._errors import FormatError
from ...io import read_checkpoint_entries
from .._registry import read_config_json
from ..llama import CheckpointLayout
from ._config import MODEL_TYPE, Gemma3Config, gemma_config_from_dict

__all__ = [
    "MULTIMODAL_MODEL_TYPE",
    "TEXT_CONFIG_DEFAULTS",
    "LAYOUTS",
    "read_multimodal_config",
    "multimodal_layout",
]

MULTIMODAL_MODEL_TYPE = "gemma3"

#: transformers' ``Gemma3TextConfig`` defaults for the fields the gemma3_text reader needs or defaults otherwise
#: (the Llama reader's ``max_position_embeddings`` 2048, head_dim hidden_size / heads): a ``text_config`` of
#: Google's checkpoints names only the fields that differ (gemma-3-4b-it's: hidden_size, intermediate_size,
#: num_hidden_layers, rope_scaling, sliding_window).
TEXT_CONFIG_DEFAULTS: dict[str, Any] = {
    "vocab_size": 262_208,
    "hidden_size": 2304,
    "intermediate_size": 9216,
    "num_hidden_layers": 26,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "max_position_embeddings": 131_072,
    "rms_norm_eps": 1e-6,
    "bos_token_id": 2,
    "eos_token_id": 1,
    "pad_token_id": 0,
}

#: The two key layouts (NOTE [gemma3 multimodal checkpoint]), by the prefix of the text model's tensors.
LAYOUTS: dict[str, CheckpointLayout] = {
    "language_model.model.": CheckpointLayout(
        renames=(("model.", "language_model.model."), ("lm_head.", "language_model.lm_head.")),
        ignored=("vision_tower.", "multi_modal_projector."),
    ),
    "model.language_model.": CheckpointLayout(
        renames=(("model.", "model.language_model."),),
        ignored=("model.vision_tower.", "model.multi_modal_projector."),
    ),
}

_WHAT = "Gemma3 config"
_log = logging.getLogger(__name__)


def read_multimodal_config(path: Any) -> Gemma3Config:
    """The ``Gemma3Config`` of a multimodal gemma3 ``config.json``'s text model (a file or its directory); errors
    are FormatErrors naming the file and the field (``text_config``'s fields as the gemma3_text reader names them).
    """
    d, p = read_config_json(path, _WHAT)
    where = repr(os.fspath(p))

    def fail(msg: str) -> Any:
        raise FormatError(f"{_WHAT} {where}: {msg}")

    if d.get("model_type") != MULTIMODAL_MODEL_TYPE:
        fail(f"model_type is {d.get('model_type')!r}, expected {MULTIMODAL_MODEL_TYPE!r}")
    if "text_config" not in d:
        fail("text_config is missing (a gemma3 checkpoint's text model is described there)")
    text = d["text_config"]
    if not isinstance(text, dict):
        fail(f"text_config must be an object, got {type(text).__name__}")
    if text.get("model_type", MODEL_TYPE) != MODEL_TYPE:
        fail(f"text_config's model_type is {text['model_type']!r}, expected {MODEL_TYPE!r}")
    tie = d.get("tie_word_embeddings", True)
    if not isinstance(tie, bool):
        fail(f"tie_word_embeddings must be true or false, got {tie!r}")
    merged = {**TEXT_CONFIG_DEFAULTS, **text, "model_type": MODEL_TYPE, "tie_word_embeddings": tie}
    merged.update({k: d[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if k in d})
    for key in ("dtype", "torch_dtype"):
        if key in d and "dtype" not in text and "torch_dtype" not in text:
            merged["dtype"] = d[key]
    cfg = gemma_config_from_dict(merged, p, f"{_WHAT} (text_config)", MODEL_TYPE, Gemma3Config, gemma3=True)
    assert isinstance(cfg, Gemma3Config)
    return cfg


def multimodal_layout(directory: Any) -> CheckpointLayout:
    """Which of ``LAYOUTS`` the multimodal checkpoint in ``directory`` uses (read from its safetensors headers);
    a FormatError naming the directory when its text model is under neither prefix or under both."""
    d = Path(directory)
    names = list(read_checkpoint_entries(d))
    found = [prefix for prefix in LAYOUTS if any(n.startswith(prefix) for n in names)]
    if len(found) != 1:
        raise FormatError(
            f"Gemma3 checkpoint {os.fspath(d)!r}: expected the text model's tensors under one of "
            f"{list(LAYOUTS)} (a gemma3 Gemma3ForConditionalGeneration checkpoint), found "
            f"{'both' if found else 'neither'}"
        )
    layout = LAYOUTS[found[0]]
    left = sum(n.startswith(layout.ignored) for n in names)
    _log.info(
        "%s: a multimodal gemma3 checkpoint: loading its text model as gemma3_text; its %d vision tower and "
        "projector tensors are not loaded (kael serves text only)",
        os.fspath(d),
        left,
    )
    return layout
