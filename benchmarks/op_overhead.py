"""Per-op overhead on tiny tensors: kael against NumPy and PyTorch (when installed), measured in one run.

For a 4-element float32 add, with a new output (``a + b``) and in place (``a.add_(b)``,
NumPy ``a += b``), prints JSON with microseconds per op (the best of several timed
loops), which kael CPU backend served the ops, and kael's frontend overhead: the
time of ``a + b`` minus the time of the backend's add kernel called directly on a
preallocated output (allocation and dispatch are counted as frontend).

The default timer is the process's CPU time, which stays meaningful on a busy
machine; ``--timer wall`` uses ``time.perf_counter``.

    python benchmarks/op_overhead.py [--backend NAME] [--number 20000] [--repeats 9] [--timer process|wall]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
import timeit
from collections.abc import Callable
from typing import Any

import kael
import numpy as np


def per_op_us(fn: Callable[[], Any], number: int, repeats: int, timer: Callable[[], float]) -> float:
    fn()  # warm-up: resolves and caches kernels
    return min(timeit.repeat(fn, number=number, repeat=repeats, timer=timer)) / number * 1e6


def measure_kael(number: int, repeats: int, timer: Callable[[], float]) -> dict[str, float]:
    a, b = kael.ones(4), kael.ones(4)
    out = kael.empty(4)
    kernel = kael.backends.current("cpu").kernel("add")
    r = {
        "add": per_op_us(lambda: a + b, number, repeats, timer),
        "add_": per_op_us(lambda: a.add_(b), number, repeats, timer),
        "kernel_add": per_op_us(lambda: kernel(out, a, b), number, repeats, timer),
    }
    r["frontend_overhead_add"] = r["add"] - r["kernel_add"]
    r["frontend_overhead_add_"] = r["add_"] - r["kernel_add"]
    return r


def measure_numpy(number: int, repeats: int, timer: Callable[[], float]) -> dict[str, float]:
    x, y = np.ones(4, np.float32), np.ones(4, np.float32)

    def iadd() -> None:
        nonlocal x
        x += y

    return {"add": per_op_us(lambda: x + y, number, repeats, timer), "add_": per_op_us(iadd, number, repeats, timer)}


def measure_torch(number: int, repeats: int, timer: Callable[[], float]) -> dict[str, Any] | None:
    try:
        import torch
    except ImportError:
        return None
    torch.set_num_threads(1)
    x, y = torch.ones(4), torch.ones(4)
    return {
        "version": torch.__version__,
        "add": per_op_us(lambda: x + y, number, repeats, timer),
        "add_": per_op_us(lambda: x.add_(y), number, repeats, timer),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default=None, help="kael CPU backend to use (default: the highest priority)")
    parser.add_argument("--number", type=int, default=20_000, help="ops per timed loop")
    parser.add_argument("--repeats", type=int, default=9, help="timed loops; the best is reported")
    parser.add_argument("--timer", choices=("process", "wall"), default="process")
    args = parser.parse_args()
    if args.backend:
        kael.backends.use("cpu", args.backend)
    timer = time.process_time if args.timer == "process" else time.perf_counter
    backend = kael.backends.current("cpu")
    k = measure_kael(args.number, args.repeats, timer)
    n = measure_numpy(args.number, args.repeats, timer)
    t = measure_torch(args.number, args.repeats, timer)
    result = {
        "benchmark": "op_overhead",
        "unit": "microseconds per op",
        "op": "4-element float32 add",
        "timer": args.timer,
        "kael_backend": {
            "name": backend.name,
            "class": f"{type(backend).__module__}.{type(backend).__qualname__}",
            "priority": backend.priority,
        },
        "kael": {key: round(v, 3) for key, v in k.items()},
        "numpy": {key: round(v, 3) for key, v in n.items()},
        "torch": None if t is None else {key: (round(v, 3) if isinstance(v, float) else v) for key, v in t.items()},
        "ratios": {
            "kael_add_over_numpy": round(k["add"] / n["add"], 2),
            "kael_add__over_numpy": round(k["add_"] / n["add_"], 2),
            **(
                {
                    "kael_add_over_torch": round(k["add"] / t["add"], 2),
                    "kael_add__over_torch": round(k["add_"] / t["add_"], 2),
                }
                if t is not None
                else {}
            ),
        },
        "versions": {"kael": kael.__version__, "numpy": np.__version__, "python": platform.python_version()},
    }
    json.dump(result, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
