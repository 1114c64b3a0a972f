"""What scripts/cuda_compile.py compiles: the kernels kael_backend_cuda hands CuPy, found at their call
sites (NOTE [kernel discovery] in cuda_compile.py), and each one as a translation unit nvcc and NVRTC
take (NOTE [elementwise wrapping], NOTE [name expressions]).
"""

from __future__ import annotations

import ast
import importlib
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

__all__ = [
    "ROOT",
    "PACKAGE",
    "DEFAULT_ARCHS",
    "KINDS",
    "PLACEHOLDER_TYPES",
    "DiscoveryError",
    "Kernel",
    "CompileResult",
    "discover",
    "translation_unit",
    "plant_error",
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
