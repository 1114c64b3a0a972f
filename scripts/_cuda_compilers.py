"""scripts/cuda_compile.py's compilers: nvcc (options translated from CuPy's NVRTC ones, diagnostics,
the entry points of the cubin) and NVRTC through ctypes.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _cuda_kernels import PLACEHOLDER_TYPES, CompileResult, DiscoveryError, Kernel, translation_unit

__all__ = ["nvcc_options", "compile_nvcc", "find_nvrtc", "compile_nvrtc"]

# --------------------------------------------------------------------------------------------------
# Compilers.
# --------------------------------------------------------------------------------------------------
_NVCC_PASS = re.compile(
    r"^(-D\S+|-U\S+|-I\S+|--define-macro=\S+|--undefine-macro=\S+|--include-path=\S+|-lineinfo|--generate-line-info"
    r"|-G|--device-debug|--use_fast_math|-use_fast_math|--fmad=(true|false)|--ftz=(true|false)"
    r"|--prec-div=(true|false)|--prec-sqrt=(true|false)|--extended-lambda|--expt-relaxed-constexpr"
    r"|-maxrregcount=\d+|--maxrregcount=\d+)$"
)


def nvcc_options(options: tuple[str, ...], site: str) -> list[str]:
    """CuPy's (NVRTC) options in nvcc's spelling; an unknown option is an error."""
    out = []
    for o in options:
        m = re.fullmatch(r"--?std=(c\+\+\d\d)", o)
        if m:
            out.append(f"-std={m.group(1)}")
        elif _NVCC_PASS.match(o):
            out.append(o)
        else:
            raise DiscoveryError(f"{site}: NVRTC option {o!r} has no nvcc spelling known to this script")
    return out


def _diagnostics(text: str) -> tuple[list[str], list[str]]:
    """(warnings, errors) lines of a compiler's output."""
    warnings, errors = [], []
    for line in text.splitlines():
        low = line.lower()
        if "warning" in low and "can be suppressed" not in low:
            warnings.append(line.strip())
        elif re.search(r"(^|\W)error\s*:|errors? detected|fatal", low):
            errors.append(line.strip())
    return warnings, errors


def _demangle(names: list[str]) -> list[str]:
    cxxfilt = shutil.which("c++filt")
    if not cxxfilt or not names:
        return names
    r = subprocess.run([cxxfilt], input="\n".join(names), capture_output=True, text=True, check=False)
    out = r.stdout.splitlines()
    return out if r.returncode == 0 and len(out) == len(names) else names


def _entries(cubin: bytes) -> list[str]:
    """The kernels of a cubin: the names of its .text.<symbol> sections, demangled."""
    syms = sorted({m.decode() for m in re.findall(rb"\.text\.([A-Za-z_$][\w$]*)\x00", cubin)})
    return _demangle(syms)


def _check_entries(k: Kernel, entries: list[str]) -> list[str]:
    """Errors when an expected entry point is missing from the binary."""
    errs = []
    if not entries:
        errs.append(f"{k.name}: the binary holds no kernel")
    want: list[str] = []
    if k.kind == "RawKernel" and k.entry:
        want = [k.entry]
    elif k.kind == "ElementwiseKernel":
        want = [f"kael_{c}::{k.name}(" for c in PLACEHOLDER_TYPES]
    else:
        want = [re.sub(r"\s+", "", e) for e in k.name_expressions]
    for w in want:
        if not any(e == w or re.sub(r"^void", "", re.sub(r"\s+", "", e)).startswith(w) for e in entries):
            errs.append(f"{k.name}: no entry point for {w!r} in the binary (found {entries})")
    return errs


def compile_nvcc(k: Kernel, arch: str, nvcc: str, workdir: Path) -> CompileResult:
    """Compile kernel k for arch (``sm_80``) to a cubin with nvcc; never raises for compiler errors."""
    t0 = time.perf_counter()
    stem = re.sub(r"\W", "_", k.name) + "_" + arch
    cu, cubin = workdir / f"{stem}.cu", workdir / f"{stem}.cubin"
    cu.write_text(translation_unit(k))
    try:
        opts = nvcc_options(k.options, k.site)
    except DiscoveryError as e:
        return CompileResult(k.name, arch, False, 0.0, "nvcc", errors=[str(e)])
    cmd = [nvcc, f"-arch={arch}", "-cubin", "--resource-usage", "-Xptxas=-warn-spills,-warn-lmem-usage", *opts]
    cmd += [str(cu), "-o", str(cubin)]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=600)
    except subprocess.TimeoutExpired:
        return CompileResult(k.name, arch, False, time.perf_counter() - t0, "nvcc", errors=["nvcc ran past 600 s"])
    out = r.stdout + r.stderr
    warnings, errors = _diagnostics(out)
    res = CompileResult(k.name, arch, r.returncode == 0, time.perf_counter() - t0, "nvcc", warnings, errors)
    if r.returncode != 0:
        res.errors = errors or out.strip().splitlines()[-20:] or [f"nvcc exited {r.returncode}"]
        return res
    regs = [int(x) for x in re.findall(r"Used (\d+) registers", out)]
    spills = [int(a) + int(b) for a, b in re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", out)]
    res.registers = max(regs) if regs else None
    res.spill_bytes = sum(spills) if spills else 0
    res.entries = _entries(cubin.read_bytes())
    res.errors = _check_entries(k, res.entries)
    res.ok = not res.errors
    return res


# NVRTC through ctypes -----------------------------------------------------------------------------
def find_nvrtc() -> str | None:
    """The path of a libnvrtc shared library: the nvidia-cuda-nvrtc wheel's, the toolkit's, or the loader's."""
    cands: list[str] = []
    for entry in sys.path:
        for sub in ("nvidia/cuda_nvrtc/lib", "nvidia/cu13/lib", "nvidia/cu12/lib"):
            cands += sorted(glob.glob(os.path.join(entry, sub, "libnvrtc.so*")))
    for base in (os.environ.get("CUDA_HOME", ""), "/usr/local/cuda"):
        if base:
            cands += sorted(glob.glob(os.path.join(base, "lib64", "libnvrtc.so*")))
    found = ctypes.util.find_library("nvrtc")
    if found:
        cands.append(found)
    for c in cands:
        if "builtins" in os.path.basename(c) or "alt" in os.path.basename(c):
            continue
        try:
            ctypes.CDLL(c)
            return c
        except OSError:
            continue
    return None


def _nvrtc_lib(path: str) -> Any:
    lib = ctypes.CDLL(path)
    vp, cp = ctypes.c_void_p, ctypes.c_char_p
    lib.nvrtcCreateProgram.argtypes = [ctypes.POINTER(vp), cp, cp, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
    lib.nvrtcAddNameExpression.argtypes = [vp, cp]
    lib.nvrtcCompileProgram.argtypes = [vp, ctypes.c_int, ctypes.POINTER(cp)]
    lib.nvrtcGetProgramLogSize.argtypes = [vp, ctypes.POINTER(ctypes.c_size_t)]
    lib.nvrtcGetProgramLog.argtypes = [vp, cp]
    lib.nvrtcGetCUBINSize.argtypes = [vp, ctypes.POINTER(ctypes.c_size_t)]
    lib.nvrtcGetCUBIN.argtypes = [vp, cp]
    lib.nvrtcGetLoweredName.argtypes = [vp, cp, ctypes.POINTER(cp)]
    lib.nvrtcDestroyProgram.argtypes = [ctypes.POINTER(vp)]
    return lib


def compile_nvrtc(k: Kernel, arch: str, libpath: str) -> CompileResult:
    """Compile kernel k for arch with NVRTC (as CuPy does: name expressions, NVRTC options), to a cubin."""
    t0 = time.perf_counter()
    lib = _nvrtc_lib(libpath)
    # NVRTC takes the name expressions itself (nvrtcAddNameExpression), not by address
    code = translation_unit(k) if k.kind == "ElementwiseKernel" else k.code
    prog = ctypes.c_void_p()
    name = re.sub(r"\W", "_", k.name).encode() + b".cu"
    if lib.nvrtcCreateProgram(ctypes.byref(prog), code.encode(), name, 0, None, None) != 0:
        return CompileResult(k.name, arch, False, 0.0, "nvrtc", errors=["nvrtcCreateProgram failed"])
    try:
        for e in k.name_expressions:
            lib.nvrtcAddNameExpression(prog, e.encode())
        opts = [f"-arch={arch}".encode(), *(o.encode() for o in k.options)]
        if k.kind == "ElementwiseKernel" and not any(o.startswith(b"--std") or o.startswith(b"-std") for o in opts):
            opts.append(b"--std=c++17")
        arr = (ctypes.c_char_p * len(opts))(*opts)
        rc = lib.nvrtcCompileProgram(prog, len(opts), arr)
        size = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        buf = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetProgramLog(prog, buf)
        log = buf.value.decode(errors="replace")
        warnings, errors = _diagnostics(log)
        res = CompileResult(k.name, arch, rc == 0, 0.0, f"nvrtc ({os.path.basename(libpath)})", warnings, errors)
        if rc != 0:
            res.errors = errors or log.strip().splitlines()[-20:] or [f"nvrtcCompileProgram returned {rc}"]
        else:
            lib.nvrtcGetCUBINSize(prog, ctypes.byref(size))
            cubin = ctypes.create_string_buffer(size.value)
            lib.nvrtcGetCUBIN(prog, cubin)
            res.entries = _entries(cubin.raw)
            for e in k.name_expressions:
                lowered = ctypes.c_char_p()
                if lib.nvrtcGetLoweredName(prog, e.encode(), ctypes.byref(lowered)) != 0:
                    res.errors.append(f"{k.name}: NVRTC has no lowered name for {e!r}")
            res.errors += _check_entries(k, res.entries)
            res.ok = not res.errors
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))
    res.seconds = time.perf_counter() - t0
    return res
