"""The model-family registry: Hugging Face ``model_type`` -> the family that loads it.

``kael.models.from_pretrained(directory)`` reads ``config.json``'s ``model_type`` and hands
the directory to that family's loader. GPT-2 (``"gpt2"``) and the Llama family (``"llama"``,
``"qwen2"``, ``"mistral"``), Qwen3 (``"qwen3"``), Qwen3-MoE (``"qwen3_moe"``), Granite (``"granite"``), SmolLM3
(``"smollm3"``), OLMo 2 (``"olmo2"``), Phi-3 (``"phi3"``), Gemma 3 (``"gemma3_text"``) and Gemma 2 (``"gemma2"``) are
built in; other families
come from packages that register under the ``kael.models`` entry-point group, the same
way backends register under ``kael.backends``::

    [project.entry-points."kael.models"]
    myfamily = "my_package.plugin"

with ``my_package/plugin.py``::

    import kael
    from kael.models import ModelFamily

    @kael.hookimpl
    def kael_model_families():
        return [ModelFamily("my_type", load)]   # load(directory, device=..., *, mmap, dtype)

Entry points load lazily (on the first look-up), through kael's plugin manager, so
``KAEL_DISABLE_PLUGIN_AUTOLOAD``, ``KAEL_BLOCK_PLUGINS`` and ``KAEL_STRICT_PLUGINS`` apply
as they do to backends. ``register_family`` adds one by hand (tests, notebooks).
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from .._errors import FormatError, KaelError, PluginError

if TYPE_CHECKING:
    from ._protocol import CausalLM

__all__ = [
    "ModelFamily",
    "register_family",
    "unregister_family",
    "families",
    "get_family",
    "model_type_of",
    "read_config_json",
    "from_pretrained",
    "ENTRY_POINT_GROUP",
]

ENTRY_POINT_GROUP = "kael.models"
DEFAULT_MODEL_TYPE = "gpt2"  # a config.json without model_type (older GPT-2 exports) is GPT-2


@dataclass(frozen=True)
class ModelFamily:
    """A model family: the ``model_type`` it serves and the function that loads its checkpoints.

    ``load(directory, device="cpu", *, mmap=False, dtype=None)`` returns a ``kael.models.CausalLM``
    in eval mode, or raises ``kael.FormatError`` naming the file and what is wrong with it.
    ``gguf_architectures`` names the GGUF ``general.architecture`` values whose files
    ``kael.models.load_gguf`` loads as this family (llama.cpp's converter names some families
    differently: ``qwen3moe`` for ``qwen3_moe``; Mistral's files say ``llama``), for
    ``python -m kael info`` and the README's family table.
    """

    model_type: str
    load: Callable[..., CausalLM]
    description: str = ""
    gguf_architectures: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.model_type, str) or not self.model_type:
            raise PluginError(f"ModelFamily: model_type must be a non-empty string, got {self.model_type!r}")
        if not callable(self.load):
            raise PluginError(f"ModelFamily {self.model_type!r}: load must be callable, got {type(self.load).__name__}")
        archs = self.gguf_architectures
        if not isinstance(archs, tuple) or not all(isinstance(a, str) and a for a in archs):
            raise PluginError(
                f"ModelFamily {self.model_type!r}: gguf_architectures must be a tuple of non-empty strings, got {archs!r}"
            )


_lock = threading.RLock()
_manual: dict[str, ModelFamily] = {}
_removed: set[str] = set()


def register_family(family: ModelFamily, *, replace: bool = False) -> None:
    """Serve ``family.model_type`` with ``family`` (``replace`` to override one already there)."""
    if not isinstance(family, ModelFamily):
        raise PluginError(f"register_family: expected a kael.models.ModelFamily, got {type(family).__name__}")
    with _lock:
        if not replace and family.model_type in families():
            raise PluginError(
                f"register_family: model_type {family.model_type!r} is already served; pass replace=True to override"
            )
        _removed.discard(family.model_type)
        _manual[family.model_type] = family


def unregister_family(model_type: str) -> None:
    """Stop serving ``model_type`` (a built-in or entry-point family too)."""
    with _lock:
        _manual.pop(model_type, None)
        _removed.add(model_type)


def _plugin_families() -> list[tuple[str, ModelFamily]]:
    """(plugin name, family) for every family the ``kael.models`` plugins provide."""
    from .._plugins import manager

    manager.ensure_loaded(ENTRY_POINT_GROUP)
    found: list[tuple[str, ModelFamily]] = []
    for impl in manager.pm.hook.kael_model_families.get_hookimpls():
        provided = cast("list[Any]", impl.function() or [])
        for fam in provided:
            if not isinstance(fam, ModelFamily):
                raise PluginError(
                    f"plugin {impl.plugin_name!r} returned {fam!r} from kael_model_families; "
                    "expected kael.models.ModelFamily instances"
                )
            found.append((impl.plugin_name, fam))
    return found


def families() -> dict[str, ModelFamily]:
    """Every family served now, by ``model_type`` (built-in, from entry points, registered by hand)."""
    from .gemma2 import FAMILIES as GEMMA2
    from .gemma3 import FAMILIES as GEMMA3
    from .gpt2 import FAMILY as GPT2
    from .granite import FAMILIES as GRANITE
    from .llama import FAMILIES as LLAMA
    from .olmo2 import FAMILIES as OLMO2
    from .phi3 import FAMILIES as PHI3
    from .qwen3 import FAMILIES as QWEN3
    from .qwen3_moe import FAMILIES as QWEN3_MOE
    from .smollm3 import FAMILIES as SMOLLM3

    with _lock:
        out: dict[str, ModelFamily] = {GPT2.model_type: GPT2}
        fams = (*LLAMA, *QWEN3, *QWEN3_MOE, *GRANITE, *SMOLLM3, *OLMO2, *PHI3, *GEMMA3, *GEMMA2)
        out.update((fam.model_type, fam) for fam in fams)
        seen: dict[str, str] = {}
        for plugin, fam in _plugin_families():
            if fam.model_type in seen and seen[fam.model_type] != plugin:
                raise PluginError(
                    f"plugins {seen[fam.model_type]!r} and {plugin!r} both provide model_type "
                    f"{fam.model_type!r}; block one with KAEL_BLOCK_PLUGINS=NAME"
                )
            seen[fam.model_type] = plugin
            out[fam.model_type] = fam
        out.update(_manual)
        return {k: v for k, v in out.items() if k not in _removed or k in _manual}


def get_family(model_type: str) -> ModelFamily:
    """The family serving ``model_type``; a KaelError listing the served ones if none does."""
    known = families()
    try:
        return known[model_type]
    except KeyError:
        raise KaelError(
            f"no model family serves model_type {model_type!r}; installed: {sorted(known)} "
            f"(families are plugins of the {ENTRY_POINT_GROUP!r} entry-point group)"
        ) from None


def read_config_json(path: Any, what: str = "model config") -> tuple[dict[str, Any], Path]:
    """A checkpoint's ``config.json`` (a file or its directory) as a dict, and the file's path.

    Every way it can fail is a FormatError naming ``what`` and the file. Families read
    their configs with it, so those errors read the same for every family.
    """
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    where = repr(os.fspath(p))
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise FormatError(f"{what} {where}: cannot read it ({exc.strerror or exc})") from None
    try:
        d = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise FormatError(f"{what} {where}: not UTF-8 JSON ({exc})") from None
    if not isinstance(d, dict):
        raise FormatError(f"{what} {where}: expected a JSON object, got {type(d).__name__}")
    return d, p


def model_type_of(path: Any) -> str:
    """The ``model_type`` of a checkpoint directory's ``config.json`` (or of that file)."""
    d, p = read_config_json(path)
    mt = d.get("model_type", DEFAULT_MODEL_TYPE)
    if not isinstance(mt, str) or not mt:
        raise FormatError(f"model config {os.fspath(p)!r}: model_type must be a non-empty string, got {mt!r}")
    return mt


def from_pretrained(
    directory: Any, device: Any = "cpu", *, mmap: bool = False, dtype: Any = None, weights: Any = None
) -> CausalLM:
    """The model in a checkpoint directory, loaded by the family its ``config.json`` names, in eval mode.

    ``dtype`` is the float dtype of the loaded parameters. ``weights`` (None, ``"f32"``,
    ``"bf16"``, ``"f16"``, ``"q8_0"``, ``"q4_0"``) then puts the projections and the token
    table in that format with ``kael.quantize`` (NOTE [weights choice] in
    ``kael/models/_weights.py``: llama.cpp's default choices; the model then computes in
    float32, so ``dtype`` must be None or float32). A quantized checkpoint loads as saved.
    ``directory`` may also be a ``.gguf`` file (``kael.models.load_gguf``).
    """
    from ._weights import apply_weights, check_weights, check_weights_dtype

    scheme = check_weights(weights)
    check_weights_dtype(scheme, dtype)
    from ._gguf import is_gguf_path, load_gguf_model

    if is_gguf_path(directory):  # a llama.cpp GGUF file: kael.models.load_gguf's model
        return load_gguf_model(directory, device, weights=weights, mmap=mmap, dtype=dtype)  # type: ignore[no-any-return]
    d = Path(directory)
    if not d.is_dir():
        raise FormatError(f"from_pretrained: {os.fspath(d)!r} is not a directory")
    family = get_family(model_type_of(d))
    model = apply_weights(family.load(d, device=device, mmap=mmap, dtype=dtype), weights)
    # The float weights ``weights`` replaced sit in the CPU allocator's cache, and the loader's first copies on
    # the C heap: give them back (SmolLM2-135M as q8_0: 468 MB resident for 143 MB of weights, 143 after).
    from .. import cpu

    cpu.empty_cache()
    return model  # type: ignore[no-any-return]
