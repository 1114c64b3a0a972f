"""The CPU backend's float32 products under each vector table it can run (KAEL_CPU_ISA), and
PyTorch's on the same shapes, in one run; prints JSON.

Each table runs in a subprocess of its own (the table is chosen once per process): prefill
GEMMs (512x768)@(768x768) and (512x768)@(768x3072) as matmul, the same as linear with a
[out, in] weight (x @ W.T + b, GPT-2 / Llama projections), in GFLOP/s; decode linear
x[1, 768] @ W.T for W [3072, 768] and [768, 3072], in GB/s of weight read. PyTorch (when
installed) runs torch.matmul / torch.nn.functional.linear with the same thread count in a
subprocess of its own. The best of --repeats timed calls after warm-up (on a shared machine
the median mostly measures the neighbours; the best is what the code can do).

    python kael_backend_cpu/benchmarks/isa_gemm.py [--threads N] [--repeats 30]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["main"]

PREFILL = [(512, 768, 768), (512, 768, 3072)]  # m, k, n
DECODE = [(3072, 768), (768, 3072)]  # W [out, in]


def _best_s(fn: Callable[[], Any], repeats: int) -> float:
    for _ in range(3):
        fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _bound(fn: Callable[..., Any], *args: Any) -> Callable[[], Any]:
    return lambda: fn(*args)


def _rates(
    name: str, x: np.ndarray, w: np.ndarray, lin: Callable[[], Any], mm: Callable[[], Any], repeats: int
) -> dict[str, float]:
    """GFLOP/s (prefill) or GB/s of weight read (decode) of the linear and matmul forms."""
    t_lin, t_mm = _best_s(lin, repeats), _best_s(mm, repeats)
    if name.startswith("prefill"):
        flops = 2.0 * x.shape[0] * x.shape[1] * w.shape[0]
        return {"matmul_gflops": round(flops / t_mm / 1e9, 1), "linear_gflops": round(flops / t_lin / 1e9, 1)}
    return {"linear_gbs": round(w.nbytes / t_lin / 1e9, 2), "matmul_gbs": round(w.nbytes / t_mm / 1e9, 2)}


def _cases(rng: np.random.Generator) -> dict[str, Any]:
    data: dict[str, Any] = {}
    for m, k, n in PREFILL:
        data[f"prefill {m}x{k}x{n}"] = (
            rng.standard_normal((m, k)).astype(np.float32),
            rng.standard_normal((n, k)).astype(np.float32),
            rng.standard_normal(n).astype(np.float32),
        )
    for n, k in DECODE:
        data[f"decode W[{n},{k}]"] = (
            rng.standard_normal((1, k)).astype(np.float32),
            rng.standard_normal((n, k)).astype(np.float32),
            rng.standard_normal(n).astype(np.float32),
        )
    return data


def run_kael(repeats: int) -> dict[str, Any]:
    import kael
    import kael.cpu

    be = kael.cpu.backend()
    matmul, linear = be.kernel("matmul"), be.kernel("linear")
    res: dict[str, Any] = {"isa": kael.cpu.isa(), "threads": kael.cpu.get_num_threads()}
    for name, (x, w, b) in _cases(np.random.default_rng(0)).items():
        tx, tw, tb = kael.tensor(x), kael.tensor(w), kael.tensor(b)
        twt = kael.tensor(np.ascontiguousarray(w.T))  # [in, out] for the matmul form
        out = kael.empty((x.shape[0], w.shape[0]))
        res[name] = _rates(name, x, w, _bound(linear, out, tx, tw, tb), _bound(matmul, out, tx, twt), repeats)
    return res


def run_torch(repeats: int, threads: int) -> dict[str, Any]:
    import torch

    torch.set_num_threads(threads)
    res: dict[str, Any] = {"torch": torch.__version__, "threads": threads, "cpu_capability": _torch_capability(torch)}
    for name, (x, w, b) in _cases(np.random.default_rng(0)).items():
        tx, tw, tb = torch.from_numpy(x), torch.from_numpy(w), torch.from_numpy(b)
        twt = torch.from_numpy(np.ascontiguousarray(w.T))
        out = torch.empty(x.shape[0], w.shape[0])
        lin = _bound(torch.nn.functional.linear, tx, tw, tb)
        res[name] = _rates(name, x, w, lin, functools.partial(torch.matmul, tx, twt, out=out), repeats)
    return res


def _torch_capability(torch: Any) -> str:
    try:
        return str(torch.backends.cpu.get_cpu_capability())
    except AttributeError:
        return "unknown"


def _child(args: list[str], env: dict[str, str]) -> dict[str, Any]:
    res = subprocess.run(
        [sys.executable, __file__, *args], env={**os.environ, **env}, capture_output=True, text=True, check=False
    )
    if res.returncode != 0:
        return {"error": res.stderr.strip().splitlines()[-1] if res.stderr.strip() else f"exit {res.returncode}"}
    parsed: dict[str, Any] = json.loads(res.stdout)
    return parsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=0, help="threads for kael and torch (default: kael's default)")
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--child", choices=["kael", "torch"], help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child == "kael":
        print(json.dumps(run_kael(a.repeats)))
        return
    if a.child == "torch":
        print(json.dumps(run_torch(a.repeats, a.threads)))
        return
    from kael_backend_cpu import get_num_threads, isa_info

    threads = a.threads or get_num_threads()
    env = {"KAEL_NUM_THREADS": str(threads)}
    info = isa_info()
    report: dict[str, Any] = {"features": [f for f, on in info["features"].items() if on], "threads": threads}
    for table in info["runnable"]:
        report[table] = _child(["--child", "kael", "--repeats", str(a.repeats)], {**env, "KAEL_CPU_ISA": table})
    report["torch"] = _child(["--child", "torch", "--repeats", str(a.repeats), "--threads", str(threads)], env)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
