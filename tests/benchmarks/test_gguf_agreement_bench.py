"""benchmarks/gguf_agreement.py's figures: ``compare`` against the formulas computed here with NumPy.

The benchmark itself needs llama.cpp and minutes per model; what it reports is this function's
arithmetic on [T, V] logit arrays, checked here on arrays whose answers are known.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import gguf_agreement  # noqa: E402


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def test_compare_reports_agreement_and_the_noise_floor():
    rng = np.random.default_rng(0)
    theirs = rng.normal(size=(64, 50))
    ours = theirs + rng.normal(scale=1e-3, size=theirs.shape)
    for r in range(4):  # four rows whose top two logits trade places: their argmax differs
        top = np.argsort(theirs[r])[-2:]
        ours[r, top] = theirs[r, top[::-1]]
    ref = theirs + rng.normal(scale=0.1, size=theirs.shape)
    self_check = theirs.copy()
    self_check[10, :] = theirs[10, ::-1]  # llama.cpp against itself: one row reordered

    got = gguf_agreement.compare(ours, theirs, ref, self_check)

    agree = ours.argmax(-1) == theirs.argmax(-1)
    assert got["top1"] == pytest.approx(agree.mean())
    assert got["top1"] <= 60 / 64 and not agree[:4].any()
    diff = ours - theirs
    assert got["max_abs"] == pytest.approx(np.abs(diff).max())
    assert got["rms"] == pytest.approx(np.sqrt((diff**2).mean()))
    assert got["rms_rel"] == pytest.approx(_rel(ours, theirs))
    assert got["kael_quant_rms_rel"] == pytest.approx(_rel(ours, ref))
    assert got["llama_quant_rms_rel"] == pytest.approx(_rel(theirs, ref))
    assert got["llama_self_rms_rel"] == pytest.approx(_rel(self_check, theirs))
    expected_self = (self_check.argmax(-1) == theirs.argmax(-1)).mean()
    assert got["llama_self_top1"] == pytest.approx(expected_self)
    same_top = theirs[10].argmax() == theirs[10, ::-1].argmax()
    assert got["llama_self_top1"] == pytest.approx(1.0 if same_top else 63 / 64)
    # clear positions: llama.cpp's top-2 margin above 4x the rms difference
    top2 = np.sort(theirs, -1)[:, -2:]
    clear = (top2[:, 1] - top2[:, 0]) > 4 * got["rms"]
    assert got["clear_positions"] == int(clear.sum()) > 0
    assert got["top1_clear"] == pytest.approx(agree[clear].mean())


def test_compare_of_identical_logits_is_perfect_agreement():
    x = np.random.default_rng(1).normal(size=(8, 16))
    got = gguf_agreement.compare(x, x, x, x)
    assert got["top1"] == got["llama_self_top1"] == 1.0
    assert got["rms"] == got["max_abs"] == got["rms_rel"] == got["llama_self_rms_rel"] == 0.0
