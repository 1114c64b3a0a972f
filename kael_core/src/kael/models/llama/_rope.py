"""Rotary embeddings of the Llama family: inverse frequencies and the cos/sin tables ``kael.rope`` reads.

The formulas are transformers' ``ROPE_INIT_FUNCTIONS`` (``modeling_rope_utils.py``) for
each ``rope_type``, with ``dim = head_dim`` (no partial rotary factor) and ``base = rope_theta``:

* ``default``: ``inv_freq[i] = base ** (-2i / dim)`` for i in 0..dim/2-1;
* ``linear``: the default divided by ``factor``;
* ``dynamic`` (NTK): ``base`` grows with the sequence length only past
  ``max_position_embeddings``; kael's context is that length, so within it the
  frequencies are the default ones, exactly as transformers computes them there;
* ``llama3``: frequencies with a wavelength above ``original / low_freq_factor`` are divided
  by ``factor``, below ``original / high_freq_factor`` kept, and smoothly interpolated between;
* ``yarn``: a ramp between interpolated and extrapolated frequencies over the correction
  range of ``beta_fast``/``beta_slow`` rotations, and cos/sin scaled by the attention factor
  (``0.1 * ln(factor) + 1`` unless given).

Tables are ``[P, dim/2]`` (``rope``'s layout: both halves of a head share them). Like
transformers, a float32 model's tables are computed as float32 products ``position *
inv_freq`` (the frequencies rounded to float32), a float64 model's in float64.
"""

from __future__ import annotations

import math

import numpy as np

from ._config import LlamaConfig

__all__ = ["inverse_frequencies", "attention_scaling", "rope_tables"]


def _default(base: float, dim: int) -> np.ndarray:
    return np.asarray(1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float64) / dim)), dtype=np.float64)


def inverse_frequencies(config: LlamaConfig) -> np.ndarray:
    """The rotary inverse frequencies [head_dim / 2] (float64) of ``config``'s rope type, divided by its
    ``rope_freq_factors`` when it has them (llama.cpp: ``theta = pos * base^(-2i/d) / freq_factors[i]``)."""
    inv = _scaled(config)
    if config.rope_freq_factors is None:
        return inv
    return np.asarray(inv / np.asarray(config.rope_freq_factors, dtype=np.float64), dtype=np.float64)


def _scaled(config: LlamaConfig) -> np.ndarray:
    base, dim, rs = config.rope_theta, config.dim, config.rope_scaling
    kind = rs.rope_type
    inv = _default(base, dim)
    if kind in ("default", "dynamic"):
        return inv
    if kind == "linear":
        return np.asarray(inv / float(rs.get("factor")), dtype=np.float64)
    if kind == "llama3":
        return _llama3(
            inv,
            rs.get("factor"),
            rs.get("low_freq_factor"),
            rs.get("high_freq_factor"),
            rs.get("original_max_position_embeddings"),
        )
    if kind == "yarn":
        return _yarn(config)
    raise AssertionError(f"rope type {kind!r} passed the config check")


def _llama3(inv: np.ndarray, factor: float, low: float, high: float, original: int) -> np.ndarray:
    low_wavelen, high_wavelen = original / low, original / high
    wavelen = 2 * math.pi / inv
    scaled = np.where(wavelen > low_wavelen, inv / factor, inv)
    smooth = (original / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return np.asarray(np.where(medium, smoothed, scaled), dtype=np.float64)


def _yarn_factor(config: LlamaConfig) -> float:
    rs = config.rope_scaling
    f = rs.get("factor")
    return float(f) if f is not None else config.max_position_embeddings / rs.get("original_max_position_embeddings")


def _yarn(config: LlamaConfig) -> np.ndarray:
    rs, base, dim = config.rope_scaling, config.rope_theta, config.dim
    factor, original = _yarn_factor(config), rs.get("original_max_position_embeddings")
    beta_fast, beta_slow = rs.get("beta_fast") or 32, rs.get("beta_slow") or 1

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if rs.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # transformers' guard against a zero-width ramp
    ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low) / (high - low), 0, 1)
    extrapolation = 1 - ramp
    pos_freqs = base ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    inv = (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation
    return np.asarray(inv, dtype=np.float64)


def attention_scaling(config: LlamaConfig) -> float:
    """The factor transformers multiplies cos and sin by (1 except for yarn)."""
    rs = config.rope_scaling
    if rs.rope_type != "yarn":
        return 1.0
    given = rs.get("attention_factor")
    if given is not None:
        return float(given)
    factor = _yarn_factor(config)

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    m, m_all = rs.get("mscale"), rs.get("mscale_all_dim")
    if m and m_all:
        return float(mscale(factor, m) / mscale(factor, m_all))
    return mscale(factor)


def rope_tables(config: LlamaConfig, positions: int, dtype: type = np.float32) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin tables [positions, head_dim / 2] of ``dtype`` (np.float32 or np.float64)."""
    inv: np.ndarray = inverse_frequencies(config).astype(dtype)
    angles = np.arange(positions, dtype=dtype)[:, None] * inv[None, :]  # products in ``dtype``, as transformers
    scale = attention_scaling(config)
    cos = np.cos(angles.astype(np.float64)).astype(dtype)
    sin = np.sin(angles.astype(np.float64)).astype(dtype)
    if scale != 1.0:
        cos, sin = (cos * dtype(scale)).astype(dtype), (sin * dtype(scale)).astype(dtype)
    return np.ascontiguousarray(cos), np.ascontiguousarray(sin)
