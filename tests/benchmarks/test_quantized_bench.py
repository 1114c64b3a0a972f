"""benchmarks/quantized.py: a ``--quick`` run prints the report's JSON (kael on every GGUF file, llama.cpp
beside it when llama-cpp-python is installed), and bad options are refused with a usage error.

No timing is judged: rates only have to be positive and finite. What is checked is the
report's shape, the formats of the files written, and that kael and llama.cpp decode the
same greedy tokens from the F32 file (the same weights computed in float32 by both).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "quantized.py"


def _llama_cpp_importable() -> bool:
    try:
        import llama_cpp  # noqa: F401
    except Exception:
        return False
    return True


@pytest.mark.slow
def test_quick_run_prints_the_report(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    gguf = pytest.importorskip("gguf")
    cmd = [sys.executable, str(SCRIPT), "--quick", "--threads", "1", "--formats", "f32,q8_0", "--keep", str(tmp_path)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads(r.stdout)
    assert report["new_tokens"] == 8 and report["prefill_tokens"] == 32 and report["converter"] == "kael"
    assert set(report["file_mb"]) == {"f32", "q8_0"}
    # the files are what they say: every projection of the q8_0 file is Q8_0, of the f32 file F32
    for fmt, want in (("f32", "F32"), ("q8_0", "Q8_0")):
        reader = gguf.GGUFReader(tmp_path / f"gpt2-{fmt}.gguf")
        types = {t.name: t.tensor_type.name for t in reader.tensors}
        assert types["blk.0.attn_qkv.weight"] == want and types["blk.1.ffn_down.weight"] == want, types
    assert "kael_cpu_isa" in report["system"]
    llama = _llama_cpp_importable()
    engines = {(run["format"], run["engine"]) for run in report["runs"]}
    want_engines = {("float32 safetensors", "kael"), ("f32", "kael"), ("q8_0", "kael")}
    if llama:
        want_engines |= {("f32", "llama.cpp"), ("q8_0", "llama.cpp")}
        assert "CPU" in report["system"]["llama_cpp_system_info"]  # llama.cpp's "CPU : SSE3 = 1 | ..." line
    else:
        assert report["llama_cpp_skipped"]
    assert engines == want_engines
    for run in report["runs"]:
        assert "error" not in run, run
        assert run["threads"] == 1
        for key in ("decode_tok_s", "prefill_tok_s", "load_s"):
            assert math.isfinite(run[key]) and run[key] > 0, (key, run)
        if run["engine"] == "kael" and run["format"] != "float32 safetensors":
            assert run["weights_scheme"] == (None if run["format"] == "f32" else run["format"])
        if run["engine"] == "llama.cpp":
            assert 0 <= run["tokens_agreeing_with_kael"] <= 8
            if run["format"] == "f32":
                assert run["tokens_agreeing_with_kael"] == 8, run
    summary = report["summary"]
    assert set(summary) == {"float32 safetensors 1t", "f32 1t", "q8_0 1t"}
    if llama:
        assert summary["q8_0 1t"]["decode_kael_over_llama_cpp"] > 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--formats", "q5_1"], "--formats: expected some of f32,bf16,f16,q8_0,q4_0, got q5_1"),
        (["--threads", "0"], "--threads: expected counts >= 1, got [0]"),
        (["--tokens", "1"], "--tokens: expected at least 2, got 1"),
    ],
)
def test_bad_options_are_usage_errors(args, message):
    r = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 2 and message in r.stderr, r.stderr
