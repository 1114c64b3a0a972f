"""The GPU validation script, run under host emulation: its plumbing, its JSON report, its PyTorch twin."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "kael_backend_cuda" / "scripts" / "validate.py"
TINY = ROOT / "tests" / "data" / "tiny-gpt2"

pytestmark = pytest.mark.skipif(not (TINY / "model.safetensors").exists(), reason="tiny GPT-2 checkpoint missing")


def test_quick_run_reports_ok_json(subprocess_env, tmp_path):
    env = dict(subprocess_env, KAEL_CUDA_EMULATE="1")
    r = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--no-conformance"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    report = json.loads(r.stdout)
    assert r.returncode == 0 and report["ok"], r.stdout + r.stderr
    assert report["emulated"] and report["device"]["emulated"]
    assert report["gpt2_tiny"]["greedy_tokens_match"]
    assert report["gpt2_tiny"]["max_abs_cuda_vs_reference"] < 1e-4
    assert report["decode"]["kael_cuda_tokens_per_s"] > 0
    assert report["dlpack"]["kael_round_trip_zero_copy"]
    quant = report["quant_formats"]
    assert quant["ok"] and len(quant["schemes"]) == 14, quant
    assert all(r["dequantize_exact"] and r["few_rows_batched_equal_alone"] for r in quant["schemes"].values())


def test_unavailable_cuda_gives_a_failing_report(subprocess_env, tmp_path):
    fake = tmp_path / "cupy"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise ImportError('simulated')\n")
    env = dict(subprocess_env, PYTHONPATH=f"{tmp_path}:{subprocess_env['PYTHONPATH']}")
    r = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    report = json.loads(r.stdout)
    assert r.returncode == 1 and not report["ok"] and "CUDA is not available" in report["error"]


def test_pytorch_twin_reproduces_the_reference_greedy_tokens():
    pytest.importorskip("torch")
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import validate
    finally:
        sys.path.remove(str(SCRIPT.parent))
    from kael.models import GPT

    model = GPT.from_pretrained(TINY)
    case = json.loads((TINY / "reference.json").read_text())["cases"][1]
    tps, tokens = validate._torch_decode(model, case["ids"], 20, device="cpu")
    assert tokens == case["greedy_20"] and tps > 0
