"""Phi-3's rotary tables: the default rope or longrope over the first ``rotary_dim`` dims of each head.

Inverse frequencies (transformers' ``_compute_longrope_parameters`` and default rope, with
``dim = rotary_dim``, ``base = rope_theta``): ``inv[i] = 1 / (f[i] * base ** (2i / dim))`` for i in
0..dim/2-1, ``f`` the ``short_factor`` or ``long_factor`` list (all ones without longrope); cos and
sin are multiplied by ``Phi3Config.attention_scale``. As in ``kael/models/llama/_rope.py``, a float32
model's angles are float32 products ``position * inv``, a float64 model's float64 ones.

NOTE [longrope factors]: transformers picks the list per forward pass (``dynamic_rope_update``'s
``longrope_frequency_update``): the long factors when the largest position the pass computes, plus
one, exceeds ``original_max_position_embeddings``, else the short ones, for every token of the pass;
keys already in the cache keep the rotation they were computed with. kael does the same per row: a
pass over a row's positions ``start .. start + T - 1`` uses the long list iff ``start + T >
original``. So one full pass over a long prompt rotates every position with the long list, while a
short prompt continued token by token keeps its short keys and rotates the positions from
``original`` on with the long list, exactly as transformers' model fed through its own KV cache does.
transformers' ``generate`` does one thing more (Phi-3's ``prepare_inputs_for_generation``): when the
sequence first passes ``original`` it drops the cache and recomputes the whole sequence in one pass,
so its keys are all long from then on. kael's ``generate`` does not recompute (nor does vLLM's
longrope, which also keeps the keys it computed): its tokens equal transformers' ``generate`` for
prompts already past ``original`` and transformers' cached forward otherwise, and may differ from
``generate`` once a short prompt's continuation crosses ``original``. (transformers decides by the largest position
of the whole batch; kael by each row's, which is the same for one sequence or right-padded rows that
share their positions, and keeps batched rows equal to each alone.) The tables hold both lists:
rows ``[0, P)`` short, ``[P, 2P)`` long (P = max_position_embeddings), and a row's positions index
the long half by adding P (``table_offset``), so ``rope`` and the decode step's ``rope`` kernel run
unchanged. A prefix-cache hit reuses keys computed by an earlier pass, whose list may differ from
the one a cold prefill of the new prompt would use (only for prompts crossing ``original``).
"""

from __future__ import annotations

import numpy as np

from ._config import Phi3Config

__all__ = ["inverse_frequencies", "rope_tables", "table_offset"]


def inverse_frequencies(config: Phi3Config, long: bool = False) -> np.ndarray:
    """The inverse frequencies [rotary_dim / 2] (float64): the short (or, ``long``, the long) factors' with longrope."""
    dim, base = config.rotary_dim, config.rope_theta
    inv = 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float64) / dim))
    lr = config.longrope
    if lr is None:
        return np.asarray(inv, dtype=np.float64)
    factors = np.asarray(lr.long_factor if long else lr.short_factor, dtype=np.float64)
    return np.asarray(inv / factors, dtype=np.float64)


def _tables(config: Phi3Config, positions: int, dtype: type, long: bool) -> tuple[np.ndarray, np.ndarray]:
    inv: np.ndarray = inverse_frequencies(config, long).astype(dtype)
    angles = np.arange(positions, dtype=dtype)[:, None] * inv[None, :]
    scale = dtype(config.attention_scale)
    cos = np.cos(angles.astype(np.float64)).astype(dtype)
    sin = np.sin(angles.astype(np.float64)).astype(dtype)
    if scale != 1:
        cos, sin = (cos * scale).astype(dtype), (sin * scale).astype(dtype)
    return cos, sin


def rope_tables(config: Phi3Config, positions: int, dtype: type = np.float32) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin [positions, rotary_dim / 2] of ``dtype``; with longrope [2 * positions, rotary_dim / 2], the
    short list's rows then the long list's (NOTE [longrope factors])."""
    cos, sin = _tables(config, positions, dtype, False)
    if config.longrope is not None:
        lcos, lsin = _tables(config, positions, dtype, True)
        cos, sin = np.concatenate([cos, lcos]), np.concatenate([sin, lsin])
    return np.ascontiguousarray(cos), np.ascontiguousarray(sin)


def table_offset(config: Phi3Config, start: int, tokens: int) -> int:
    """What to add to a row's positions ``start .. start + tokens - 1`` to index its tables: P (the long half)
    when longrope's long list applies to that pass, else 0 (NOTE [longrope factors])."""
    lr = config.longrope
    if lr is None or start + tokens <= lr.original_max_position_embeddings:
        return 0
    return config.max_position_embeddings
