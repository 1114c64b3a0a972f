"""benchmarks/quantized.py: a ``--quick`` run prints the report's JSON (kael on every GGUF file, llama.cpp's
``llama-bench`` beside it when built), and bad options are refused with a usage error.

No timing is judged: rates only have to be positive and finite. What is checked is the report's
shape, the formats of the files written (llama-quantize's mixes: a Q4_K_M file holds Q4_K and
Q6_K tensors), the bytes a decoded token reads, and the roofline fractions' arithmetic.
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
sys.path.insert(0, str(ROOT / "tests"))

import llama_cpp_tools  # noqa: E402


@pytest.mark.slow
def test_quick_run_prints_the_report(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    gguf = pytest.importorskip("gguf")
    cmd = [sys.executable, str(SCRIPT), "--quick", "--threads", "1", "--formats", "f32,q8_0,q4_k_m"]
    r = subprocess.run([*cmd, "--keep", str(tmp_path)], capture_output=True, text=True, timeout=900, check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads(r.stdout)
    assert report["new_tokens"] == 8 and report["prefill_tokens"] == 32
    assert set(report["file_mb"]) == {f"{m} {f}" for m in ("gpt2", "smollm2") for f in ("f32", "q8_0", "q4_k_m")}
    for model, qkv in (("gpt2", "blk.0.attn_qkv.weight"), ("smollm2", "blk.0.attn_q.weight")):
        for fmt, want in (("f32", {"F32"}), ("q8_0", {"Q8_0"}), ("q4_k_m", {"Q4_K", "Q5_0", "Q6_K", "Q8_0"})):
            reader = gguf.GGUFReader(tmp_path / f"{model}-{fmt}.gguf")
            types = {t.name: t.tensor_type.name for t in reader.tensors}
            assert types[qkv] in want, (model, fmt, types[qkv])
            # every tensor's bytes, the token table counted whole (tied: it is the head too)
            total = sum(int(t.n_bytes) for t in reader.tensors if t.name != "position_embd.weight")
            pos = [t for t in reader.tensors if t.name == "position_embd.weight"]
            total += sum(int(t.n_bytes) // int(t.shape[-1]) for t in pos)
            assert report["bytes_per_token"][f"{model} {fmt}"] == total
    assert "kael_cpu_isa" in report["system"]
    assert all(v > 0 for v in report["bandwidth_gb_s"].values())
    assert report["llc_bytes"] is None or report["llc_bytes"] >= 2**20
    assert set(report["roofline_bandwidth_gb_s"]) == set(report["bytes_per_token"])
    assert all(set(bw) == {"1"} and bw["1"] > 0 for bw in report["roofline_bandwidth_gb_s"].values())
    llama = llama_cpp_tools.find_tool("llama-bench") is not None
    engines = {(run["model"], run["format"], run["engine"]) for run in report["runs"]}
    for model in ("gpt2", "smollm2"):
        assert (model, "float32 safetensors", "kael") in engines
        for fmt in ("f32", "q8_0", "q4_k_m"):
            assert (model, fmt, "kael") in engines
            assert ((model, fmt, "llama-bench") in engines) == llama
    if not llama:
        assert report["llama_cpp_skipped"]
    for run in report["runs"]:
        assert "error" not in run, run
        for key in ("decode_tok_s", "prefill_tok_s"):
            assert math.isfinite(run[key]) and run[key] > 0, (key, run)
        if run["engine"] == "llama-bench":
            assert run["build"]["build_commit"] and run["build"]["cpu_info"]
            assert run["peak_rss_mb"] > 0
        else:  # resident memory from /proc: the peak covers the loaded model
            assert 0 < run["base_rss_mb"] < run["loaded_rss_mb"] <= run["peak_rss_mb"], run
            assert run["base_rss_mb"] < run["end_rss_mb"] <= run["peak_rss_mb"], run
    for key, row in report["summary"].items():
        model, fmt, threads = key.split(" ")[0], " ".join(key.split(" ")[1:-1]), key.split(" ")[-1]
        if "kael_roofline" in row:
            size = report["bytes_per_token"][f"{model} {fmt}"]
            bw = report["roofline_bandwidth_gb_s"][f"{model} {fmt}"][threads.rstrip("t")] * 1e9
            assert row["kael_roofline"] == pytest.approx(size * row["kael_decode_tok_s"] / bw, rel=0.02, abs=2e-3)
        if llama and fmt != "float32 safetensors":
            assert row["decode_kael_over_llama"] > 0 and row["prefill_kael_over_llama"] > 0
            assert row["llama_bench_peak_rss_mb"] > 0
        assert 0 < row["kael_loaded_mb"] <= row["kael_run_mb"] and 0 < row["kael_end_mb"] <= row["kael_run_mb"], row


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--formats", "q4_0,q7_0"], "--formats: expected some of f32,bf16,f16,q8_0,q4_0,q4_k_m,q4_1,q5_0,"),
        (["--models", "bert"], "--models: expected some of gpt2,smollm2, got bert"),
        (["--threads", "0"], "--threads: expected counts >= 1, got [0]"),
        (["--tokens", "1"], "--tokens: expected at least 2, got 1"),
    ],
)
def test_bad_options_are_usage_errors(args: list[str], message: str) -> None:
    r = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 2 and message in r.stderr, r.stderr
    if args[0] == "--formats":  # every llama-quantize type of the registry is allowed, then what was given
        assert ",q3_k_m," in r.stderr and ",iq4_xs" in r.stderr and r.stderr.rstrip().endswith("got q4_0,q7_0")
