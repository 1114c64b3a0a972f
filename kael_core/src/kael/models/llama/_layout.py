"""``CheckpointLayout``: where a checkpoint keeps a Llama-family model's tensors, when not under their own names.

A family's model names its parameters after its own checkpoint keys (``model.layers.0.mlp.up_proj.weight``),
so loading is a mapping. A checkpoint of a larger model holding this one (Gemma 3's multimodal
``Gemma3ForConditionalGeneration``: the text model under ``language_model.model.`` or
``model.language_model.``, beside a vision tower) stores the same tensors under a prefix, with tensors of the
other parts beside them. The loader (``kael.models.llama.from_pretrained``) asks the model class for its
layout (``checkpoint_layout(directory)``), checks and reads the stored names, and hands the model its own.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CheckpointLayout"]


@dataclass(frozen=True)
class CheckpointLayout:
    """``renames``: (model-name prefix, stored-name prefix) pairs, the first matching prefix wins (a name none
    matches is stored as it is); ``ignored``: stored-name prefixes of the other parts' tensors, neither checked
    nor read (``kael.io.load_checkpoint_tensors``' ``ignore``). The default is a checkpoint of the model alone."""

    renames: tuple[tuple[str, str], ...] = ()
    ignored: tuple[str, ...] = ()

    def stored(self, name: str) -> str:
        """The checkpoint key of the model's tensor ``name``."""
        for ours, theirs in self.renames:
            if name.startswith(ours):
                return theirs + name[len(ours) :]
        return name
