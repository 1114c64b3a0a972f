"""Sliding-window layers of the Llama-derived families: which layers attend to a window, from ``config.json``.

A config's ``layer_windows`` (``LlamaConfig``) holds one window per layer, 0 for a layer that attends to the
whole context; a layer with a window W attends to the keys of its last W positions (NOTE [sliding window] in
kael/ops/_attention_fused.py), as transformers masks it. transformers' families spell it three ways:

* mistral: ``sliding_window`` (an int or null) on every layer;
* qwen2, qwen3, smollm3: ``sliding_window`` only when ``use_sliding_window`` is true, and then on the layers
  ``layer_types`` marks ``"sliding_attention"`` (when it is null, the family's default: qwen2 and qwen3 from
  ``max_window_layers`` on, smollm3 its no-rope layers);
* llama: transformers' Llama has no sliding window, so a ``sliding_window`` shorter than the context is refused
  rather than silently ignored or applied.

A window at least as long as ``max_position_embeddings`` changes nothing, so it reads as no window at all.
``window_fields`` writes a config's windows back in the family's spelling (``save_pretrained``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._config import LlamaConfig

__all__ = ["layer_windows", "family_layer_windows", "window_fields"]

SLIDING, FULL = "sliding_attention", "full_attention"


def _window(d: dict[str, Any], fail: Any) -> int | None:
    w = d.get("sliding_window")
    if w is not None and (isinstance(w, bool) or not isinstance(w, int) or w < 1):
        fail(f"sliding_window must be a positive integer or null, got {w!r}")
    return w


def _per_layer(types: Any, layers: int, w: int, ctx: int, fail: Any) -> tuple[int, ...]:
    if not isinstance(types, list) or len(types) != layers or any(t not in (SLIDING, FULL) for t in types):
        fail(
            f"layer_types must be a list of {layers} entries, each {SLIDING!r} or {FULL!r}, got "
            f"{types if isinstance(types, list) and len(types) < 8 else type(types).__name__ + ' of that length'}"
        )
    if w >= ctx or SLIDING not in types:
        return ()
    return tuple(w if t == SLIDING else 0 for t in types)


def layer_windows(d: dict[str, Any], model_type: str, layers: int, ctx: int, fail: Any) -> tuple[int, ...]:
    """The per-layer windows of a llama / qwen2 / mistral ``config.json`` dict (``()``: none)."""
    if model_type == "qwen2":
        return family_layer_windows(d, lambda: _from_max_window_layers(d, layers), layers, ctx, fail)
    if model_type == "llama" and "sliding_window" not in d:
        return ()
    w = _window(d, fail)
    if w is None or w >= ctx:
        return ()
    if model_type == "llama":
        fail(
            f"sliding_window {w} is shorter than max_position_embeddings {ctx}, but transformers' Llama has no "
            "sliding-window attention (set it to null, or use model_type 'mistral' for a model trained with one)"
        )
    return (w,) * layers


def family_layer_windows(
    d: dict[str, Any], default_layer_types: Callable[[], Any], layers: int, ctx: int, fail: Any
) -> tuple[int, ...]:
    """The per-layer windows of a family that applies ``sliding_window`` only with ``use_sliding_window``, to the
    layers ``layer_types`` (or, when null, ``default_layer_types()``) marks sliding. ``fail(message)`` raises the
    family's FormatError."""
    use = d.get("use_sliding_window", False)
    if not isinstance(use, bool):
        fail(f"use_sliding_window must be true or false, got {use!r}")
    w = _window(d, fail)
    if not use or w is None:
        return ()
    types = d.get("layer_types")
    return _per_layer(default_layer_types() if types is None else types, layers, w, ctx, fail)


def _from_max_window_layers(d: dict[str, Any], layers: int) -> list[str]:
    """transformers' qwen2 / qwen3 default ``layer_types``: sliding from ``max_window_layers`` on."""
    start = d.get("max_window_layers", 28)
    return [SLIDING if isinstance(start, int) and i >= start else FULL for i in range(layers)]


def window_fields(config: LlamaConfig) -> dict[str, Any]:
    """``config``'s windows as transformers' ``config.json`` fields: mistral's ``sliding_window``; the others'
    ``use_sliding_window``, ``sliding_window``, ``max_window_layers`` and ``layer_types``."""
    ws = config.layer_windows
    w = max(ws) if ws else None
    if config.model_type == "mistral":
        return {"sliding_window": w}
    if w is None:
        return {"sliding_window": None, "use_sliding_window": False, "max_window_layers": config.num_hidden_layers}
    first = next(i for i, x in enumerate(ws) if x)
    return {
        "sliding_window": w,
        "use_sliding_window": True,
        "max_window_layers": first,
        "layer_types": [SLIDING if x else FULL for x in ws],
    }
