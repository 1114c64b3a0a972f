"""CPU kernel throughput: kael_backend_cpu against NumPy (and PyTorch when installed).

For 1 and 2 threads (each in a subprocess, so OpenBLAS and PyTorch pick the thread
count up at start), times the kernels the issue lists on preallocated outputs: add of
4M float32 (contiguous, and with one operand transposed), sum over the last dim of
4096x1024, softmax and layer_norm over rows of 4096x768, gelu (tanh form) of 4M, GEMV
(1x768)@(768x2304) and (1x768)@(768x50257), GEMM (512x768)@(768x3072) and
(1024x1024)@(1024x1024). NumPy runs the same math as a composition of its ufuncs
(with out= where it has one); PyTorch runs its fused op. Each library is timed in a
pass of its own, so the spinning worker threads one library leaves behind do not steal
the cores of the next. Prints JSON: milliseconds
(best of --repeats runs in each of --rounds rounds), GB/s (bytes read + written) or GFLOP/s, and kael's speed-up
over NumPy and PyTorch.

    python benchmarks/cpu_kernels.py [--threads 1 2] [--repeats 5] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

GELU_K = float(np.sqrt(2.0 / np.pi))


def best_ms(fn: Callable[[], Any], repeats: int) -> float:
    fn()
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best * 1e3


def _kael_setup() -> tuple[Any, Callable[..., Any], Callable[..., Any]]:
    import kael
    from kael.backends import dtypes as dt
    from kael.backends import memory

    import kael_backend_cpu

    backend = kael_backend_cpu.CpuBackend()

    cpu = kael.device("cpu")

    def wrap(a: np.ndarray) -> Any:
        return kael.from_numpy(a)  # shares a's memory (float32 or int64 arrays)

    def empty(shape: tuple[int, ...], d: Any = dt.float32) -> Any:
        n = int(np.prod(shape)) * d.itemsize
        return memory.wrap_buffer(backend.allocate(n, cpu), n, cpu, shape, memory.contiguous_strides(shape), d)

    return backend, wrap, empty


def cases(rng: np.random.Generator) -> list[dict[str, Any]]:
    """Each case: name, shape, unit, amount (bytes or flops) and the three implementations."""
    backend, wrap, empty = _kael_setup()
    k = backend.kernel
    try:
        import torch
    except ImportError:  # optional oracle
        torch = None
    out: list[dict[str, Any]] = []

    def add_case(
        name: str,
        shape: str,
        unit: str,
        amount: float,
        kael_fn: Callable[[], Any],
        numpy_fn: Callable[[], Any],
        torch_fn: Callable[[], Any] | None,
    ) -> None:
        out.append(
            {
                "kernel": name,
                "shape": shape,
                "unit": unit,
                "amount": amount,
                "kael": kael_fn,
                "numpy": numpy_fn,
                "torch": torch_fn,
            }
        )

    f32 = np.float32
    # add, 4M float32
    a, b = rng.standard_normal((2048, 2048)).astype(f32), rng.standard_normal((2048, 2048)).astype(f32)
    o = np.empty_like(a)
    ka, kb, ko = wrap(a), wrap(b), empty((2048, 2048))
    kbt = wrap(b).T
    ta, tb, to = (torch.from_numpy(a), torch.from_numpy(b), torch.empty(2048, 2048)) if torch else (None,) * 3
    add_case(
        "add",
        "2048x2048 f32",
        "GB/s",
        3 * a.nbytes,
        lambda: k("add")(ko, ka, kb),
        lambda: np.add(a, b, out=o),
        (lambda: torch.add(ta, tb, out=to)) if torch else None,
    )
    add_case(
        "add_transposed",
        "2048x2048 + (2048x2048).T f32",
        "GB/s",
        3 * a.nbytes,
        lambda: k("add")(ko, ka, kbt),
        lambda: np.add(a, b.T, out=o),
        (lambda: torch.add(ta, tb.T, out=to)) if torch else None,
    )
    # sum over the last dim
    x = rng.standard_normal((4096, 1024)).astype(f32)
    kx, ks = wrap(x), empty((4096, 1))
    s = np.empty((4096, 1), f32)
    tx = torch.from_numpy(x) if torch else None
    add_case(
        "sum_last_dim",
        "4096x1024 f32",
        "GB/s",
        x.nbytes,
        lambda: k("sum")(ks, kx, (1,)),
        lambda: np.sum(x, axis=1, keepdims=True, out=s),
        (lambda: tx.sum(1, keepdim=True)) if torch else None,
    )
    # softmax and layer_norm over rows
    r = rng.standard_normal((4096, 768)).astype(f32)
    kr, kro = wrap(r), empty((4096, 768))
    w, bias = rng.standard_normal(768).astype(f32), rng.standard_normal(768).astype(f32)
    kw, kbias = wrap(w), wrap(bias)
    mean, rstd = empty((4096,)), empty((4096,))
    tr = torch.from_numpy(r) if torch else None
    tw, tbias = (torch.from_numpy(w), torch.from_numpy(bias)) if torch else (None, None)

    def np_softmax() -> Any:
        e = np.exp(r - r.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)

    def np_layer_norm() -> Any:
        mu = r.mean(axis=1, keepdims=True)
        d = r - mu
        var = (d * d).mean(axis=1, keepdims=True)
        return d / np.sqrt(var + 1e-5) * w + bias

    add_case(
        "softmax",
        "4096x768 f32 rows",
        "GB/s",
        2 * r.nbytes,
        lambda: k("softmax")(kro, kr, 1),
        np_softmax,
        (lambda: torch.softmax(tr, 1)) if torch else None,
    )
    add_case(
        "layer_norm",
        "4096x768 f32 rows",
        "GB/s",
        2 * r.nbytes,
        lambda: k("layer_norm")(kro, mean, rstd, kr, kw, kbias, 1e-5),
        np_layer_norm,
        (lambda: torch.nn.functional.layer_norm(tr, (768,), tw, tbias)) if torch else None,
    )
    # gelu (tanh form), 4M

    def np_gelu() -> Any:
        return 0.5 * a * (1.0 + np.tanh(GELU_K * (a + 0.044715 * a**3)))

    add_case(
        "gelu_tanh",
        "4M f32",
        "GB/s",
        2 * a.nbytes,
        lambda: k("gelu")(ko, ka, "tanh"),
        np_gelu,
        (lambda: torch.nn.functional.gelu(ta, approximate="tanh")) if torch else None,
    )
    # GEMV and GEMM
    for m, kk, n in [(1, 768, 2304), (1, 768, 50257), (512, 768, 3072), (1024, 1024, 1024)]:
        xa = rng.standard_normal((m, kk)).astype(f32)
        wb = rng.standard_normal((kk, n)).astype(f32)
        oc = np.empty((m, n), f32)
        kxa, kwb, koc = wrap(xa), wrap(wb), empty((m, n))
        txa, twb, toc = (torch.from_numpy(xa), torch.from_numpy(wb), torch.empty(m, n)) if torch else (None,) * 3
        gemv = m == 1
        add_case(
            "gemv" if gemv else "gemm",
            f"({m}x{kk})@({kk}x{n}) f32",
            "GB/s" if gemv else "GFLOP/s",
            4.0 * kk * n if gemv else 2.0 * m * kk * n,
            (lambda kxa=kxa, kwb=kwb, koc=koc: k("matmul")(koc, kxa, kwb)),
            (lambda xa=xa, wb=wb, oc=oc: np.matmul(xa, wb, out=oc)),
            (lambda txa=txa, twb=twb, toc=toc: torch.matmul(txa, twb, out=toc)) if torch else None,
        )
    return out


def run_threads(threads: int, repeats: int, rounds: int) -> list[dict[str, Any]]:
    """Measure every case with `threads` threads (called in a child process)."""
    import kael_backend_cpu

    kael_backend_cpu.set_num_threads(threads)
    try:
        import torch

        torch.set_num_threads(threads)
    except ImportError:
        pass
    # One implementation at a time over every case: the worker threads of one library
    # (OpenBLAS and OpenMP spin for a while after each call) must not compete with the
    # next library's on a small machine.
    # Several rounds, keeping each (case, library)'s best: a burst of other work on the
    # machine spoils one round of one library, not the result.
    all_cases = cases(np.random.default_rng(0))
    times: dict[tuple[int, str], float] = {}
    for _ in range(rounds):
        for impl in ("kael", "numpy", "torch"):
            for i, c in enumerate(all_cases):
                if c[impl] is not None:
                    t = best_ms(c[impl], repeats)
                    times[(i, impl)] = min(t, times.get((i, impl), t))
    rows = []
    for i, c in enumerate(all_cases):
        row: dict[str, Any] = {"kernel": c["kernel"], "shape": c["shape"], "threads": threads, "unit": c["unit"]}
        for impl in ("kael", "numpy", "torch"):
            if (i, impl) not in times:
                continue
            ms = times[(i, impl)]
            rate = c["amount"] / (ms * 1e-3) / 1e9
            row[f"{impl}_ms"] = round(ms, 4)
            row[f"{impl}_{'gflops' if c['unit'] == 'GFLOP/s' else 'gbps'}"] = round(rate, 2)
        row["speedup_vs_numpy"] = round(row["numpy_ms"] / row["kael_ms"], 3)
        if "torch_ms" in row:
            row["speedup_vs_torch"] = round(row["torch_ms"] / row["kael_ms"], 3)
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--child", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(run_threads(args.child, args.repeats, args.rounds)))
        return
    rows: list[dict[str, Any]] = []
    for n in args.threads:
        env = dict(
            os.environ,
            OPENBLAS_NUM_THREADS=str(n),
            OMP_NUM_THREADS=str(n),
            MKL_NUM_THREADS=str(n),
            KAEL_NUM_THREADS=str(n),
        )
        res = subprocess.run(
            [sys.executable, __file__, "--child", str(n), "--repeats", str(args.repeats), "--rounds", str(args.rounds)],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        rows.extend(json.loads(res.stdout.strip().splitlines()[-1]))
    import kael_backend_cpu

    report = {
        "benchmark": "cpu_kernels",
        "machine": {
            "cpu": platform.processor() or platform.machine(),
            "cores": os.cpu_count(),
            "isa": kael_backend_cpu.CpuBackend().isa(),
            "numpy": np.__version__,
        },
        "results": rows,
        "summary": {f"{r['kernel']} {r['shape']} t={r['threads']}": r["speedup_vs_numpy"] for r in rows},
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
