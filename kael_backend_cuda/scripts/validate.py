"""GPU validation of kael-backend-cuda: one run, one JSON report on stdout, under 5 minutes.

Run it on a machine with an NVIDIA GPU where kael-core, kael-backend-cuda and CuPy are
already installed (it installs nothing)::

    python kael_backend_cuda/scripts/validate.py            # the full report
    python kael_backend_cuda/scripts/validate.py --quick    # smoke run (tiny model, few tokens)

Sections: the device; the conformance kit for the cuda backend (a pytest subprocess,
every kernel including the raw CUDA ones against the NumPy reference); DLPack zero-copy
with CuPy (and PyTorch CUDA when installed); GPT-2 logits parity between cpu and cuda
on the reference tiny checkpoint (``tests/data/tiny-gpt2``, also against its stored
logits and greedy tokens) and on a randomly initialised GPT-2 small; greedy decode
tokens/s at batch 1 in float32 for kael on cuda, and for a plain PyTorch GPT-2 with a KV
cache over the same weights when PyTorch with CUDA is installed; every weight format's
kernels (``validate_quant.py``: dequantize bit for bit against gguf, quantized_linear's
two paths against float64, batched == alone, times at 4096 x 4096). ``ok`` is true when
every check passed. With ``KAEL_CUDA_EMULATE=1`` it runs on the host (a plumbing check).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "tests" / "data" / "tiny-gpt2"
BUDGET_S = 280.0  # stay under 5 minutes in all


def bootstrap(site: Path) -> dict[str, str]:
    """Make kael and the cuda plugin importable and discoverable from a checkout (nothing is installed).

    Returns the environment for subprocesses: PYTHONPATH with the source folders and, when
    the package is not installed, a throwaway .dist-info declaring its entry point.
    """
    paths = []
    for src, mod in ((ROOT / "kael_core" / "src", "kael"), (ROOT / "kael_backend_cuda" / "src", "kael_backend_cuda")):
        try:
            __import__(mod)
        except ImportError:
            sys.path.insert(0, str(src))
            paths.append(str(src))
    if not any(ep.name == "cuda" for ep in metadata.entry_points(group="kael.backends")):
        info = site / "kael_backend_cuda-0.1.0.dist-info"
        info.mkdir(parents=True, exist_ok=True)
        (info / "METADATA").write_text("Metadata-Version: 2.1\nName: kael-backend-cuda\nVersion: 0.1.0\n")
        (info / "entry_points.txt").write_text("[kael.backends]\ncuda = kael_backend_cuda.plugin\n")
        sys.path.insert(0, str(site))
        paths.insert(0, str(site))
        importlib.invalidate_caches()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(paths + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


def section(report: dict[str, Any], name: str, fn: Callable[[], dict[str, Any]]) -> None:
    """Run one section; an exception becomes {"ok": false, "error": ...} instead of ending the run."""
    t0 = time.perf_counter()
    try:
        out = fn()
    except Exception as exc:
        out = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-3000:]}
    out["seconds"] = round(time.perf_counter() - t0, 2)
    report[name] = out


def device_info() -> dict[str, Any]:
    import kael

    b = kael.backends.current("cuda")
    info: dict[str, Any] = {
        "ok": True,
        "backend": repr(b),
        "emulated": bool(getattr(b, "emulated", False)),
        "device_count": kael.cuda.device_count(),
        "kael": kael.__version__,
    }
    if not info["emulated"]:
        import cupy

        props = cupy.cuda.runtime.getDeviceProperties(0)
        info.update(
            name=props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"]),
            compute_capability=f"{props['major']}.{props['minor']}",
            memory_bytes=int(props["totalGlobalMem"]),
            cupy=cupy.__version__,
            cuda_runtime=cupy.cuda.runtime.runtimeGetVersion(),
            cuda_driver=cupy.cuda.runtime.driverGetVersion(),
        )
    return info


def conformance(timeout: float, env: dict[str, str]) -> dict[str, Any]:
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "--pyargs",
        "kael.testing.conformance",
        "--kael-backend",
        "cuda",
        "-q",
        "-p",
        "no:cacheprovider",
        "-o",
        "addopts=",
    ]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env)
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": f"the conformance kit did not finish in {timeout:.0f} s"}
    summary = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else ""
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|errors?)", summary)}
    out: dict[str, Any] = {"ok": r.returncode == 0, "returncode": r.returncode, "summary": summary, **counts}
    if r.returncode != 0:
        out["failures"] = [line for line in r.stdout.splitlines() if line.startswith(("FAILED", "ERROR"))][:40]
        out["stderr"] = r.stderr[-2000:]
    return out


def dlpack() -> dict[str, Any]:
    import kael

    out: dict[str, Any] = {}
    t = kael.arange(6, device="cuda").float()
    u = kael.from_dlpack(t)
    u.add_(1.0)
    out["kael_round_trip_zero_copy"] = t.tolist() == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    if getattr(kael.backends.current("cuda"), "emulated", False):
        out["ok"] = out["kael_round_trip_zero_copy"]
        return out
    import cupy

    c = cupy.arange(4, dtype=cupy.float32)
    k = kael.from_dlpack(c)
    c += 10
    back = cupy.from_dlpack(k)
    back[0] = -1
    out["cupy_zero_copy"] = k.tolist() == [-1.0, 11.0, 12.0, 13.0] and float(c[0]) == -1.0
    try:
        torch: Any = importlib.import_module("torch")
    except ImportError:
        torch = None
    if torch is not None and torch.cuda.is_available():
        tt = torch.arange(4, dtype=torch.float32, device="cuda")
        kt = kael.from_dlpack(tt)
        tt.mul_(2)
        t2 = torch.from_dlpack(kt)
        t2[1] = 100.0
        out["torch_zero_copy"] = kt.tolist() == [0.0, 100.0, 4.0, 6.0] and tt[1].item() == 100.0
    else:
        out["torch_zero_copy"] = None
    out["ok"] = all(v is not False for v in out.values())
    return out


def _logits(model: Any, ids: list[int], device: str) -> np.ndarray:
    import kael

    with kael.no_grad():
        return model(kael.tensor([ids], device=device)).cpu().numpy()[0]  # type: ignore[no-any-return]


def gpt2_tiny(tiny: Path, greedy_tokens: int) -> dict[str, Any]:
    import kael
    from kael.models import GPT

    ref = json.loads((tiny / "reference.json").read_text())
    stored = kael.load_safetensors(tiny / "reference.safetensors")
    cpu = GPT.from_pretrained(tiny, device="cpu")
    gpu = GPT.from_pretrained(tiny, device="cuda")
    worst_pair, worst_ref, greedy_ok = 0.0, 0.0, True
    for case in ref["cases"]:
        ids = case["ids"][: cpu.max_positions]
        a, b = _logits(cpu, ids, "cpu"), _logits(gpu, ids, "cuda")
        worst_pair = max(worst_pair, float(np.abs(a - b).max()))
        if "logits_key" in case:  # the sliding-window case stores greedy tokens only
            want = stored[case["logits_key"]].numpy()
            worst_ref = max(worst_ref, float(np.abs(b - want).max()))
        n = min(greedy_tokens, len(case["greedy_20"]))
        greedy_ok &= gpu.generate(case["ids"], n) == case["greedy_20"][:n]
    tol = float(ref.get("tolerance_logits_max_abs", 1e-4))
    return {
        "ok": worst_pair < tol and worst_ref < tol and greedy_ok,
        "cases": len(ref["cases"]),
        "max_abs_cpu_vs_cuda": worst_pair,
        "max_abs_cuda_vs_reference": worst_ref,
        "tolerance": tol,
        "greedy_tokens_match": greedy_ok,
    }


def gpt2_small(tokens: int) -> tuple[dict[str, Any], Any]:
    import kael
    from kael.models import GPT

    cpu = GPT(generator=kael.Generator().manual_seed(0))
    gpu = GPT(init=False, device="cuda")
    with kael.no_grad():
        for (name, p), (name2, q) in zip(cpu.named_parameters(), gpu.named_parameters()):
            assert name == name2
            q.copy_(p.to("cuda"))
    ids = [int(i) for i in np.random.default_rng(0).integers(0, 50257, size=tokens)]
    a, b = _logits(cpu, ids, "cpu"), _logits(gpu, ids, "cuda")
    diff = float(np.abs(a - b).max())
    scale = float(np.abs(a).max())
    return {
        "ok": diff <= 1e-4 * max(1.0, scale),
        "tokens": tokens,
        "max_abs_cpu_vs_cuda": diff,
        "max_abs_logit": scale,
    }, gpu


def _kael_decode(model: Any, prompt: list[int], new: int) -> tuple[float, list[int]]:
    import kael

    model.generate(prompt, 4)  # warm-up: compiles the kernels this shape needs
    kael.cuda.synchronize()
    t0 = time.perf_counter()
    out = model.generate(prompt, new)
    kael.cuda.synchronize()
    return new / (time.perf_counter() - t0), out


def _torch_decode(model: Any, prompt: list[int], new: int, device: str = "cuda") -> tuple[float, list[int]] | None:
    """Greedy decode with a plain PyTorch GPT-2 (KV cache, SDPA) over model's weights; None without torch CUDA."""
    try:
        import torch
    except ImportError:
        return None
    if device == "cuda" and not torch.cuda.is_available():
        return None
    import torch.nn.functional as tf

    cfg = model.config
    dev = torch.device(device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    w = {n: torch.as_tensor(p.detach().cpu().numpy(), device=dev) for n, p in model.named_parameters()}
    h, d, eps = cfg.heads, cfg.dimension // cfg.heads, cfg.layer_norm_epsilon
    total = len(prompt) + new
    kc = torch.zeros(cfg.layers, 1, h, total, d, device=dev)
    vc = torch.zeros_like(kc)

    @torch.no_grad()
    def forward(ids: list[int], start: int) -> torch.Tensor:
        t = len(ids)
        x = w["wte.weight"][torch.tensor(ids, device=dev)] + w["wpe.weight"][start : start + t]
        for i in range(cfg.layers):
            p = f"h.{i}."
            a = tf.layer_norm(x, (cfg.dimension,), w[p + "ln_1.weight"], w[p + "ln_1.bias"], eps)
            q, k, v = (a @ w[p + "attn.c_attn.weight"] + w[p + "attn.c_attn.bias"]).view(t, 3, h, d).unbind(1)
            kc[i, 0, :, start : start + t] = k.transpose(0, 1)
            vc[i, 0, :, start : start + t] = v.transpose(0, 1)
            y = tf.scaled_dot_product_attention(
                q.transpose(0, 1)[None],
                kc[i, :, :, : start + t],
                vc[i, :, :, : start + t],
                is_causal=t > 1 and start == 0,
            )
            x = x + y[0].transpose(0, 1).reshape(t, -1) @ w[p + "attn.c_proj.weight"] + w[p + "attn.c_proj.bias"]
            a = tf.layer_norm(x, (cfg.dimension,), w[p + "ln_2.weight"], w[p + "ln_2.bias"], eps)
            a = tf.gelu(a @ w[p + "mlp.c_fc.weight"] + w[p + "mlp.c_fc.bias"], approximate="tanh")
            x = x + a @ w[p + "mlp.c_proj.weight"] + w[p + "mlp.c_proj.bias"]
        x = tf.layer_norm(x[-1], (cfg.dimension,), w["ln_f.weight"], w["ln_f.bias"], eps)
        return x @ w["wte.weight"].T

    def run(n: int) -> list[int]:
        logits = forward(prompt, 0)
        out = []
        for i in range(n):
            tok = int(logits.argmax().item())
            out.append(tok)
            logits = forward([tok], len(prompt) + i)
        return out

    run(4)
    sync()
    t0 = time.perf_counter()
    out = run(new)
    sync()
    return new / (time.perf_counter() - t0), out


def decode(model: Any, prompt_len: int, new: int) -> dict[str, Any]:
    prompt = [int(i) for i in np.random.default_rng(1).integers(0, model.vocab_size, size=prompt_len)]
    kael_tps, kael_tokens = _kael_decode(model, prompt, new)
    out: dict[str, Any] = {
        "ok": True,
        "batch": 1,
        "dtype": "float32",
        "prompt_tokens": prompt_len,
        "new_tokens": new,
        "kael_cuda_tokens_per_s": round(kael_tps, 2),
    }
    torch_run = _torch_decode(model, prompt, new)
    if torch_run is None:
        out["torch_cuda_tokens_per_s"] = None
    else:
        out["torch_cuda_tokens_per_s"] = round(torch_run[0], 2)
        out["kael_over_torch"] = round(kael_tps / torch_run[0], 3)
        out["same_greedy_tokens_as_torch"] = torch_run[1] == kael_tokens
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="smoke run: no GPT-2 small, 8 decode tokens")
    ap.add_argument("--no-conformance", action="store_true", help="skip the conformance kit")
    ap.add_argument("--tiny", type=Path, default=TINY, help="the tiny GPT-2 reference checkpoint directory")
    ap.add_argument("--new-tokens", type=int, default=128, help="decode benchmark: new tokens (default 128)")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    report: dict[str, Any] = {
        "script": "kael_backend_cuda/scripts/validate.py",
        "emulated": os.environ.get("KAEL_CUDA_EMULATE", "") not in ("", "0"),
    }
    with tempfile.TemporaryDirectory() as site:
        env = bootstrap(Path(site))
        return run(args, report, env, t0)


def run(args: argparse.Namespace, report: dict[str, Any], env: dict[str, str], t0: float) -> int:
    import kael

    if not kael.cuda.is_available():
        report.update(ok=False, error=f"CUDA is not available: {kael.cuda.unavailable_reason()}")
        print(json.dumps(report, indent=2))
        return 1
    section(report, "device", device_info)
    if not args.no_conformance:
        section(report, "conformance", lambda: conformance(150.0, env))
    section(report, "dlpack", dlpack)
    section(report, "gpt2_tiny", lambda: gpt2_tiny(args.tiny, 8 if args.quick else 20))
    from validate_quant import quant_formats  # beside this script

    section(report, "quant_formats", lambda: quant_formats(args.quick))
    if args.quick:
        from kael.models import GPT

        model = GPT.from_pretrained(args.tiny, device="cuda")
        section(report, "decode", lambda: decode(model, 16, min(args.new_tokens, 8)))
    else:
        holder: dict[str, Any] = {}

        def small() -> dict[str, Any]:
            out, holder["model"] = gpt2_small(64)
            return out

        section(report, "gpt2_small_random", small)
        if "model" in holder and time.perf_counter() - t0 < BUDGET_S - 60:
            section(report, "decode", lambda: decode(holder["model"], 16, args.new_tokens))
        else:
            report["decode"] = {"ok": False, "error": "skipped: no model, or not enough time left"}
    section(report, "memory_stats", lambda: {"ok": True, **kael.cuda.memory_stats()})
    report["seconds"] = round(time.perf_counter() - t0, 1)
    report["ok"] = all(v.get("ok", True) for v in report.values() if isinstance(v, dict))
    print(json.dumps(report, indent=2))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
