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
import ast
import ctypes
import ctypes.util
import glob
import importlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

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
    "main",
]

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "kael_backend_cuda"
DEFAULT_ARCHS = ("sm_80", "sm_90")
KINDS = ("RawModule", "RawKernel", "ElementwiseKernel", "ReductionKernel")

# CuPy's signatures (cupy 13), to bind positional arguments of a call site to names.
_SIGNATURES: dict[str, tuple[str, ...]] = {
    "RawModule": ("code",),  # the rest is keyword-only
    "RawKernel": ("code", "name", "options", "backend", "translate_cucomplex"),
    "ElementwiseKernel": (
        "in_params",
        "out_params",
        "operation",
        "name",
        "reduce_dims",
        "preamble",
        "no_return",
        "return_tuple",
        "loop_prep",
        "after_loop",
    ),
}

# CuPy's scalar type names -> C types (NOTE [elementwise wrapping]).
_CTYPES = {
    "bool": "bool",
    "int8": "signed char",
    "int16": "short",
    "int32": "int",
    "int64": "long long",
    "uint8": "unsigned char",
    "uint16": "unsigned short",
    "uint32": "unsigned int",
    "uint64": "unsigned long long",
    "float32": "float",
    "float64": "double",
}
_REFUSED_TYPES = ("float16", "complex64", "complex128")
PLACEHOLDER_TYPES = ("float", "double")


class DiscoveryError(Exception):
    """A call site or source of the package that this script cannot turn into a compilable kernel."""


@dataclass(frozen=True)
class Kernel:
    """One kernel (a RawModule's whole source counts as one) as the backend hands it to CuPy.

    ``name`` identifies it in the report (an ElementwiseKernel's or RawKernel's CuPy name, a
    RawModule's code expression); ``site`` is ``file:line`` of the call; ``code`` is the CUDA
    source (for an ElementwiseKernel the loop body); ``options`` are CuPy's (NVRTC) options;
    ``name_expressions`` the template instances NVRTC is asked for; ``params`` an
    ElementwiseKernel's (in_params, out_params, preamble, loop_prep, after_loop).
    """

    name: str
    kind: str
    site: str
    code: str
    options: tuple[str, ...] = ()
    name_expressions: tuple[str, ...] = ()
    params: tuple[str, str, str, str, str] | None = None
    entry: str | None = None  # RawKernel: the function CuPy looks up


@dataclass
class CompileResult:
    """The outcome of compiling one kernel for one architecture."""

    kernel: str
    arch: str
    ok: bool
    seconds: float
    compiler: str
    warnings: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    entries: list[str] = field(default_factory=list)
    registers: int | None = None
    spill_bytes: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__, seconds=round(self.seconds, 3))


# --------------------------------------------------------------------------------------------------
# Discovery (NOTE [kernel discovery]).
# --------------------------------------------------------------------------------------------------
def _package_dir() -> Path:
    try:
        mod = importlib.import_module(PACKAGE)
    except ImportError:
        sys.path.insert(0, str(ROOT / "kael_backend_cuda" / "src"))
        sys.path.insert(0, str(ROOT / "kael_core" / "src"))
        mod = importlib.import_module(PACKAGE)
    return Path(next(iter(mod.__path__)))


def _kind(call: ast.Call) -> str | None:
    f = call.func
    name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
    return name if name in KINDS else None


def _parents(tree: ast.AST) -> dict[ast.AST, ast.AST]:
    return {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}


def _evaluate(node: ast.expr, env: dict[str, Any]) -> Any:
    return eval(compile(ast.Expression(node), "<call site>", "eval"), env)  # the package's own code


def _bindings(call: ast.Call, parents: dict[ast.AST, ast.AST], env: dict[str, Any]) -> list[dict[str, Any]]:
    """The environments a call site's arguments are evaluated in: the module's, or one per table entry."""
    fn: ast.AST | None = call
    while fn is not None and not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
        fn = parents.get(fn)
    if fn is None:
        return [env]
    for node in ast.walk(fn):
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.value, ast.Subscript)
            and isinstance(node.value.slice, ast.Name)
        ):
            try:
                table = _evaluate(node.value.value, env)
            except Exception:
                continue
            if not isinstance(table, dict):
                continue
            target, key_name = node.targets[0], node.value.slice.id
            names = [target] if isinstance(target, ast.Name) else getattr(target, "elts", None)
            if not names or not all(isinstance(n, ast.Name) for n in names):
                continue
            out = []
            for key, value in table.items():
                local = dict(env)
                local[key_name] = key
                values = [value] if isinstance(target, ast.Name) else list(value)
                if len(values) != len(names):
                    continue
                local.update({n.id: v for n, v in zip(names, values)})  # type: ignore[union-attr]
                out.append(local)
            return out
    return [env]


def _kernels_at(call: ast.Call, kind: str, site: str, env: dict[str, Any]) -> Kernel:
    names = _SIGNATURES.get(kind)
    if names is None:
        raise DiscoveryError(f"{site}: {kind} is not supported by this script (its CUDA wrapping is not modelled)")
    if len(call.args) > len(names) or any(isinstance(a, ast.Starred) for a in call.args):
        raise DiscoveryError(f"{site}: {kind} call with arguments this script cannot bind: {ast.unparse(call)}")
    nodes = dict(zip(names, call.args))
    for kw in call.keywords:
        if kw.arg is None:
            raise DiscoveryError(f"{site}: {kind} call with **kwargs cannot be resolved: {ast.unparse(call)}")
        nodes[kw.arg] = kw.value
    try:
        a = {k: _evaluate(v, env) for k, v in nodes.items()}
    except Exception as e:
        raise DiscoveryError(
            f"{site}: the arguments of {ast.unparse(call)} cannot be evaluated from the module "
            f"({type(e).__name__}: {e}); make them module-level names (NOTE [kernel discovery])"
        ) from e
    options = tuple(a.get("options") or ())
    if a.get("backend", "nvrtc") != "nvrtc" or a.get("jitify") or a.get("translate_cucomplex"):
        raise DiscoveryError(f"{site}: backend/jitify/translate_cucomplex other than CuPy's defaults are not modelled")
    if kind == "RawModule":
        if a.get("path") is not None or not isinstance(a.get("code"), str):
            raise DiscoveryError(f"{site}: RawModule without a CUDA source string (code=)")
        return Kernel(
            name=ast.unparse(nodes["code"]),
            kind=kind,
            site=site,
            code=a["code"],
            options=options,
            name_expressions=tuple(a.get("name_expressions") or ()),
        )
    if kind == "RawKernel":
        return Kernel(name=a["name"], kind=kind, site=site, code=a["code"], options=options, entry=a["name"])
    params = (a["in_params"], a["out_params"], a.get("preamble", ""), a.get("loop_prep", ""), a.get("after_loop", ""))
    return Kernel(
        name=a.get("name", "kernel"), kind=kind, site=site, code=a["operation"], options=options, params=params
    )


def discover(package_dir: Path | None = None, package: str = PACKAGE) -> list[Kernel]:
    """Every kernel the package compiles, from its call sites (NOTE [kernel discovery]).

    package_dir is the folder of the importable package ``package`` (default: kael_backend_cuda's).

    Raises DiscoveryError naming the file and line of a call site it cannot resolve, or a
    module-level CUDA source (a string holding ``__global__``) that no call site compiles.
    """
    pdir = package_dir or _package_dir()
    kernels: list[Kernel] = []
    sources: dict[str, str] = {}  # module-level CUDA sources: "module.NAME" -> code
    for path in sorted(pdir.glob("*.py")):
        text = path.read_text()
        if not re.search(r"\b(" + "|".join(KINDS) + r")\b|__global__", text):
            continue
        module: ModuleType = importlib.import_module(f"{package}.{path.stem}")
        env = dict(vars(module))
        for k, v in env.items():
            if isinstance(v, str) and "__global__" in v:
                sources[f"{path.stem}.{k}"] = v
        tree = ast.parse(text, str(path))
        parents = _parents(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and (kind := _kind(node)) is not None:
                site = f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}:{node.lineno}"
                for local in _bindings(node, parents, env):
                    kernels.append(_kernels_at(node, kind, site, local))
    compiled = {k.code for k in kernels}
    orphans = sorted(n for n, code in sources.items() if code not in compiled)
    if orphans:
        raise DiscoveryError(f"CUDA sources that no RawModule/RawKernel call site compiles: {orphans}")
    names = [k.name for k in kernels]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise DiscoveryError(f"kernel names found twice: {dup}")
    return kernels


# --------------------------------------------------------------------------------------------------
# Translation units.
# --------------------------------------------------------------------------------------------------
def _parse_params(spec: str, site: str) -> list[tuple[bool, str, str]]:
    """CuPy's 'T x, raw int32 n' -> [(raw, type, name), ...]."""
    out = []
    for p in (s.strip() for s in spec.split(",")):
        if not p:
            continue
        words = p.split()
        raw = words[0] == "raw"
        if raw:
            words = words[1:]
        if len(words) != 2:
            raise DiscoveryError(f"{site}: cannot parse the ElementwiseKernel parameter {p!r}")
        if words[0] in _REFUSED_TYPES:
            raise DiscoveryError(f"{site}: parameter type {words[0]!r} is not modelled by this script")
        out.append((raw, words[0], words[1]))
    return out


def _elementwise_unit(k: Kernel) -> str:
    assert k.params is not None
    ins, outs, preamble, loop_prep, after_loop = k.params
    params = [(True, *p) for p in _parse_params(ins, k.site)] + [(False, *p) for p in _parse_params(outs, k.site)]
    placeholders = sorted({t for _, _, t, _ in params if t not in _CTYPES})
    parts = [f"// ElementwiseKernel {k.name} ({k.site}), wrapped as CuPy does (NOTE [elementwise wrapping])", preamble]
    for ctype in PLACEHOLDER_TYPES:
        decl, bind = [], []
        for is_in, raw, t, n in params:
            c = "const " if is_in else ""
            t = _CTYPES.get(t, t)
            if raw:
                decl.append(f"{c}{t}* __restrict__ {n}")
            else:
                decl.append(f"{c}{t}* __restrict__ _raw_{n}")
                bind.append(f"{c}{t}& {n} = _raw_{n}[i];")
        decl.append("long long _n")
        typedefs = "".join(f"typedef {ctype} {t};\n" for t in placeholders)
        parts.append(
            f"namespace kael_{ctype} {{\n{typedefs}" + f"__global__ void {k.name}({', '.join(decl)}) {{\n{loop_prep};\n"
            "for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < _n;"
            " i += (long long)blockDim.x * gridDim.x) {\n"
            + "\n".join(bind)
            + f"\n{k.code}\n;}}\n{after_loop};\n}}\n}}  // namespace kael_{ctype}\n"
        )
    return "\n".join(parts)


def translation_unit(k: Kernel) -> str:
    """The complete CUDA C++ source compiled for kernel k (NOTE [name expressions], [elementwise wrapping])."""
    if k.kind == "ElementwiseKernel":
        return _elementwise_unit(k)
    lines = [k.code, "", "// name expressions, instantiated by taking their address (NOTE [name expressions])"]
    lines += [f"void* kael_name_expression_{i} = (void*)&{e};" for i, e in enumerate(k.name_expressions)]
    return "\n".join(lines) + "\n"


def plant_error(k: Kernel) -> Kernel:
    """k with a type error planted in its code (a string literal initialising an int)."""
    bad = 'int kael_planted_error = "a planted type error";'
    if k.kind == "ElementwiseKernel":
        return Kernel(**{**k.__dict__, "code": k.code + "\n" + bad})
    m = re.search(r"__global__[^{;]*\{", k.code)
    if m is None:
        raise DiscoveryError(f"{k.name}: no __global__ function to plant an error in")
    return Kernel(**{**k.__dict__, "code": k.code[: m.end()] + bad + k.code[m.end() :]})


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
