"""Compile every CUDA kernel source of kael-backend-cuda for sm_80 and sm_90, without a GPU.

One command for CI and for a GPU machine::

    python scripts/cuda_compile.py                      # compile all, JSON report on stdout
    python scripts/cuda_compile.py --arch sm_80 --arch sm_90 --arch sm_120
    python scripts/cuda_compile.py --plant-error kael_gelu   # must fail, naming kael_gelu
    python scripts/cuda_compile.py -- --quick           # flags after -- go to validate.py

It finds the kernels in the package itself (NOTE [kernel discovery]), compiles each one for
each architecture with ``nvcc -cubin`` (or, where nvcc is absent, NVRTC through ctypes: the
``nvidia-cuda-nvrtc-cu12`` wheel's or the toolkit's ``libnvrtc``), and prints one JSON
report: a row per (kernel, arch) with ``ok``, the compiler's warnings, the entry points
found in the binary, registers and spill bytes (nvcc only), and seconds. Warnings are
reported, not fatal; any error makes the exit status 1. When CuPy sees a GPU, it then runs
``kael_backend_cuda/scripts/validate.py`` (the arguments after ``--`` are passed on) and
exits with its status; ``--no-validate`` skips that.

NOTE [kernel discovery]
    The oracle is the code that compiles the kernels, not a list kept beside it. Every
    ``.py`` file of the package is parsed; each call ``*.RawModule(...)``,
    ``*.RawKernel(...)``, ``*.ElementwiseKernel(...)`` (``ReductionKernel`` is refused:
    none exists and its wrapping is not modelled) is a call site, and its arguments are
    evaluated in the imported module's namespace, so the code, options and name expressions
    are exactly the ones the backend passes CuPy. Arguments that are locals of the enclosing
    function are resolved for one idiom, the one ``_pointwise_kernels._ew`` uses: an assignment
    ``a, b, c = TABLE[key]`` in that function, with ``TABLE`` a module-level dict; the call
    site then stands for one kernel per entry of ``TABLE`` (``key`` bound to the entry's
    key). A call site that cannot be resolved is an error, as is a module-level string
    holding ``__global__`` that no call site compiles: a new kernel cannot be skipped
    silently. ``tests/scripts/test_cuda_compile.py`` also greps the source for call sites.

NOTE [elementwise wrapping]
    An ``ElementwiseKernel`` is a loop body, not a translation unit. CuPy makes it one
    ``extern "C" __global__`` function with the parameters, a grid-stride loop over ``i``,
    and, per non-``raw`` parameter, a reference to element ``i`` bound to its name (inputs
    ``const``; a scalar argument is a by-value ``const`` parameter, which type-checks the
    body the same way); placeholder types (``T``) become typedefs of the dtypes of a call.
    Here each kernel is wrapped the same way, once per placeholder binding, ``float`` and
    ``double`` (the backend calls them in float32 or float64; every placeholder of a kernel
    takes the same type), each copy in its own namespace of one translation unit, with
    ``i`` a ``long long`` element index into plain pointers. CuPy's type names map to C
    types (``int32`` -> ``int``, ``float64`` -> ``double``, ...); ``float16`` and the
    complex types are refused, as is a ``raw`` parameter used other than by ``[]``.
    ``preamble``, ``loop_prep`` and ``after_loop`` go where CuPy puts them.

NOTE [name expressions]
    NVRTC instantiates a template kernel for each name expression given to
    ``nvrtcAddNameExpression`` (``softmax_rows<float>``); a template never instantiated is
    barely type-checked. nvcc does the same when the address of the instance is taken, so
    the translation unit gets ``void* kael_name_expression_N = (void*)&EXPR;`` per
    expression, and the binary must then hold an entry point for each. CuPy's NVRTC
    options are translated to nvcc's (``--std=c++14`` -> ``-std=c++14``); an option
    without a known nvcc spelling is an error, not dropped.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from _cuda_compilers import compile_nvcc, compile_nvrtc, find_nvrtc, nvcc_options
from _cuda_kernels import (
    DEFAULT_ARCHS,
    ROOT,
    CompileResult,
    DiscoveryError,
    Kernel,
    discover,
    plant_error,
    translation_unit,
)

__all__ = [
    "Kernel",
    "CompileResult",
    "DiscoveryError",
    "discover",
    "translation_unit",
    "plant_error",
    "compile_nvcc",
    "compile_nvrtc",
    "find_nvrtc",
    "nvcc_options",
    "main",
]


# --------------------------------------------------------------------------------------------------
# The command.
# --------------------------------------------------------------------------------------------------
def _gpu_available() -> tuple[bool, str]:
    try:
        import cupy  # type: ignore[import-not-found]

        n = int(cupy.cuda.runtime.getDeviceCount())
    except Exception as e:
        return False, f"{type(e).__name__}: {e}"
    return n > 0, f"{n} device(s)"


def main(argv: list[str] | None = None) -> int:
    """Run the command; returns the exit status (1 when any kernel fails to compile)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    passthrough: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, passthrough = argv[:i], argv[i + 1 :]
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--arch", action="append", help="an sm_XX architecture (repeatable; default sm_80 and sm_90)")
    ap.add_argument(
        "--compiler",
        choices=("auto", "nvcc", "nvrtc", "all"),
        default="auto",
        help="auto (default): nvcc if on PATH, else NVRTC; all: every one found",
    )
    ap.add_argument("--plant-error", metavar="KERNEL", help="plant a type error in KERNEL (a name of --list)")
    ap.add_argument("--list", action="store_true", help="list the discovered kernels and exit")
    ap.add_argument("--no-validate", action="store_true", help="do not run validate.py even with a GPU")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="parallel compiles")
    args = ap.parse_args(argv)
    archs = args.arch or list(DEFAULT_ARCHS)
    for a in archs:
        if not re.fullmatch(r"sm_\d+[af]?", a):
            ap.error(f"--arch {a!r}: expected sm_XX, e.g. sm_80")
    try:
        kernels = discover()
    except DiscoveryError as e:
        print(json.dumps({"ok": False, "error": f"discovery: {e}"}, indent=1))
        return 1
    if args.list:
        for k in kernels:
            print(
                f"{k.name}\t{k.kind}\t{k.site}\toptions={list(k.options)}\tname_expressions={list(k.name_expressions)}"
            )
        return 0
    if args.plant_error:
        names = [k.name for k in kernels]
        if args.plant_error not in names:
            ap.error(f"--plant-error {args.plant_error!r}: no such kernel; expected one of {names}")
        kernels = [plant_error(k) if k.name == args.plant_error else k for k in kernels]

    nvcc = shutil.which("nvcc")
    nvrtc = find_nvrtc()
    compilers = {"nvcc": [nvcc], "nvrtc": [nvrtc], "all": [nvcc, nvrtc], "auto": [nvcc or nvrtc]}[args.compiler]
    if (args.compiler != "all" and None in compilers) or not any(compilers):
        why = "nvcc is not on PATH; libnvrtc not found (pip install nvidia-cuda-nvrtc-cu12)"
        print(json.dumps({"ok": False, "error": f"--compiler {args.compiler}: {why}"}, indent=1))
        return 1

    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="kael-cuda-compile-") as tmp:
        jobs = [(k, a, c) for c in compilers if c for k in kernels for a in archs]

        def run(job: tuple[Kernel, str, str]) -> CompileResult:
            k, a, c = job
            try:
                if c == nvcc:
                    return compile_nvcc(k, a, c, Path(tmp))
                return compile_nvrtc(k, a, c)
            except DiscoveryError as e:
                return CompileResult(k.name, a, False, 0.0, "-", errors=[str(e)])

        with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            results = list(pool.map(run, jobs))
    failed = sorted({r.kernel for r in results if not r.ok})
    report: dict[str, Any] = {
        "ok": not failed,
        "compilers": sorted({r.compiler for r in results}),
        "archs": archs,
        "kernels": len(kernels),
        "failed": failed,
        "warnings": sum(len(r.warnings) for r in results),
        "seconds": round(time.perf_counter() - t0, 2),
        "results": [r.as_dict() for r in results],
    }
    gpu, why = _gpu_available()
    report["gpu"] = why
    print(json.dumps(report, indent=1), flush=True)
    for r in results:  # a readable table on stderr, the JSON on stdout
        mark = "ok  " if r.ok else "FAIL"
        print(
            f"{mark} {r.kernel:28} {r.arch:6} {r.compiler:24} {r.seconds:6.2f}s warnings={len(r.warnings)}",
            file=sys.stderr,
        )
        for line in r.errors[:10]:
            print(f"     error: {line}", file=sys.stderr)
    if failed:
        print(f"cuda_compile: FAILED: {failed}", file=sys.stderr)
        return 1
    if gpu and not args.no_validate:
        validate = ROOT / "kael_backend_cuda" / "scripts" / "validate.py"
        print(f"cuda_compile: a GPU is present ({why}): running {validate}", file=sys.stderr, flush=True)
        return subprocess.run([sys.executable, str(validate), *passthrough], check=False).returncode
    return 0


if __name__ == "__main__":
    sys.exit(main())
