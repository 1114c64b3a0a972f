"""scripts/cuda_compile.py: every CUDA kernel of kael-backend-cuda compiles for sm_80 and sm_90
(nvcc and NVRTC, each skipped when absent), a planted error fails naming the kernel, and the
discovered kernels cover every ``RawModule(`` / ``RawKernel(`` / ``ElementwiseKernel(`` call site
of the package (its source grepped as the oracle) and every ``__global__`` function of its sources.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "cuda_compile.py"
PKG = ROOT / "kael_backend_cuda" / "src" / "kael_backend_cuda"


def _load() -> ModuleType:
    if str(SCRIPT.parent) not in sys.path:  # its helper modules (_cuda_kernels, _cuda_compilers) sit beside it
        sys.path.insert(0, str(SCRIPT.parent))
    spec = importlib.util.spec_from_file_location("cuda_compile", SCRIPT)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["cuda_compile"] = mod
    spec.loader.exec_module(mod)
    return mod


cc = _load()
NVCC = __import__("shutil").which("nvcc")
NVRTC = cc.find_nvrtc()
COMPILERS = [
    pytest.param("nvcc", marks=pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH")),
    pytest.param("nvrtc", marks=pytest.mark.skipif(NVRTC is None, reason="no libnvrtc (nvidia-cuda-nvrtc-cu12)")),
]
needs_a_compiler = pytest.mark.skipif(NVCC is None and NVRTC is None, reason="neither nvcc nor libnvrtc")
FAST = "nvrtc" if NVRTC else "nvcc"  # the quicker compiler where a test needs just one


def _compile(k, arch: str = "sm_80", compiler: str = FAST, tmp: Path | None = None):
    if compiler == "nvrtc":
        return cc.compile_nvrtc(k, arch, NVRTC)
    assert tmp is not None
    return cc.compile_nvcc(k, arch, NVCC, tmp)


def _run(*args: str) -> tuple[int, dict, str]:
    r = subprocess.run(
        [sys.executable, str(SCRIPT), "--no-validate", *args], capture_output=True, text=True, timeout=900
    )
    return r.returncode, json.loads(r.stdout), r.stderr


# -- discovery against the source, grepped ----------------------------------------------------------
def _grep_call_sites() -> set[str]:
    sites = set()
    for path in sorted(PKG.glob("*.py")):
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"\b(RawModule|RawKernel|ElementwiseKernel|ReductionKernel)\(", line):
                sites.add(f"{path.relative_to(ROOT)}:{i}")
    return sites


def test_discovered_kernels_cover_every_call_site_and_kernel_function():
    from kael_backend_cuda import _quant
    from kael_backend_cuda import _raw_kernels as raw

    kernels = cc.discover()
    sites = _grep_call_sites()
    assert sites, "the grep found no call site at all"
    assert {k.site for k in kernels} == sites
    by_name = {k.name: k for k in kernels}
    # each ElementwiseKernel call site: one kernel per table entry, with that entry's sources
    for key, (ins, outs, body) in raw.ELEMENTWISE_SOURCES.items():
        k = by_name[f"kael_{key}"]
        assert k.kind == "ElementwiseKernel" and k.code == body and k.params[:2] == (ins, outs)
    # each __global__ function of every module-level CUDA source is compiled: the templates through a
    # name expression per type, the extern "C" ones as they are
    sources = {}
    for path in sorted(PKG.glob("*.py")):
        for m in re.finditer(r'^(\w+) = r?"""(.*?)"""', path.read_text(), re.S | re.M):
            if "__global__" in m.group(2):
                sources[m.group(1)] = m.group(2)
    assert set(sources) <= set(by_name), (set(sources), set(by_name))
    for name, src in sources.items():
        k = by_name[name]
        assert k.kind in ("RawModule", "RawKernel") and k.code.strip() == src.strip()
        for fn in re.findall(r"__global__\s+void\s+(\w+)\s*\(", src):
            if re.search(rf"template\s*<[^>]*>\s*__global__\s+void\s+{fn}\b", src):
                assert {f"{fn}<float>", f"{fn}<double>"} <= set(k.name_expressions), (name, fn)
            else:
                assert 'extern "C"' in src, (name, fn)
    assert by_name["ROW_KERNELS_SOURCE"].name_expressions == tuple(raw.row_kernel_names())
    assert by_name["QUANT_KERNELS_SOURCE"].options == ("--std=c++14",)
    assert set(_quant.QUANT_KERNEL_NAMES) <= set(re.findall(r"__global__\s+void\s+(\w+)", _quant.QUANT_KERNELS_SOURCE))


def _fake_package(tmp_path: Path, name: str, body: str) -> Path:
    pkg = tmp_path / name
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "_k.py").write_text(textwrap.dedent(body))
    return pkg


def test_discovery_resolves_the_table_idiom_and_refuses_what_it_cannot_compile(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    good = _fake_package(
        tmp_path,
        "fake_good",
        '''
        SRC = r"""extern "C" __global__ void k(float* x) { x[0] = 1.0f; }"""
        OPTS = ("-std=c++17",)
        TABLE = {"a": ("T x", "T y", "y = x;"), "b": ("T x, T z", "T y", "y = x * z;")}
        def raw(cupy):
            return cupy.RawKernel(SRC, "k", options=OPTS)
        def ew(cupy, name):
            ins, outs, body = TABLE[name]
            return cupy.ElementwiseKernel(ins, outs, body, f"ew_{name}")
        ''',
    )
    ks = {k.name: k for k in cc.discover(good, "fake_good")}
    assert set(ks) == {"k", "ew_a", "ew_b"}
    assert ks["k"].kind == "RawKernel" and ks["k"].options == ("-std=c++17",) and ks["k"].entry == "k"
    assert ks["ew_b"].params[:2] == ("T x, T z", "T y") and ks["ew_b"].code == "y = x * z;"

    orphan = _fake_package(
        tmp_path,
        "fake_orphan",
        '''
        SRC = r"""extern "C" __global__ void k(float* x) { x[0] = 1.0f; }"""
        NEW = r"""extern "C" __global__ void forgotten(float* x) { x[0] = 2.0f; }"""
        def raw(cupy):
            return cupy.RawModule(code=SRC)
        ''',
    )
    with pytest.raises(cc.DiscoveryError, match=r"no RawModule/RawKernel call site compiles: \['_k\.NEW'\]"):
        cc.discover(orphan, "fake_orphan")

    local = _fake_package(
        tmp_path,
        "fake_local",
        """
        def raw(cupy, code):
            return cupy.RawModule(code=code, options=("--std=c++14",))
        """,
    )
    with pytest.raises(cc.DiscoveryError, match=r"_k\.py:3: the arguments of .*RawModule.*cannot be evaluated"):
        cc.discover(local, "fake_local")


# -- compiling ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("compiler", COMPILERS)
def test_every_kernel_compiles_for_sm80_and_sm90(compiler):
    from kael_backend_cuda import _conv, _moe_source, _pool, _quant
    from kael_backend_cuda import _raw_kernels as raw

    rc, report, err = _run("--compiler", compiler)
    assert rc == 0, err
    assert report["ok"] and report["failed"] == [] and report["archs"] == ["sm_80", "sm_90"]
    names = {k.name for k in cc.discover()}
    rows = {(r["kernel"], r["arch"]): r for r in report["results"]}
    assert set(rows) == {(n, a) for n in names for a in ("sm_80", "sm_90")}
    for (name, _arch), r in rows.items():
        assert r["ok"] and not r["errors"], r
        if name == "ROW_KERNELS_SOURCE":  # one entry point per template instance, demangled
            assert len(r["entries"]) == len(raw.row_kernel_names())
            for e in raw.row_kernel_names():
                assert any(x.startswith(f"void {e}(") for x in r["entries"]), (e, r["entries"])
        elif name in ("CONV_KERNELS_SOURCE", "POOL_KERNELS_SOURCE", "MOE_KERNELS_SOURCE"):  # template instances
            want = {
                "CONV_KERNELS_SOURCE": _conv.CONV_KERNEL_NAMES,
                "POOL_KERNELS_SOURCE": _pool.POOL_KERNEL_NAMES,
                "MOE_KERNELS_SOURCE": _moe_source.MOE_KERNEL_NAMES,
            }[name]
            assert len(r["entries"]) == len(want)
            for e in want:
                assert any(x.startswith(f"void {e}(") for x in r["entries"]), (e, r["entries"])
        elif name == "QUANT_KERNELS_SOURCE":  # extern "C": the names CuPy's get_function looks up
            assert sorted(r["entries"]) == sorted(_quant.QUANT_KERNEL_NAMES)
        else:
            assert sorted(e.split("(")[0] for e in r["entries"]) == [f"kael_double::{name}", f"kael_float::{name}"]
    assert len(report["results"]) == 2 * len(names) and re.search(r"ok +kael_gelu +sm_90", err)


@pytest.mark.parametrize("compiler", COMPILERS)
@pytest.mark.parametrize("victim", ["ROW_KERNELS_SOURCE", "kael_gelu_backward"])
def test_a_planted_error_fails_naming_the_kernel(compiler, victim):
    rc, report, err = _run("--compiler", compiler, "--arch", "sm_90", "--plant-error", victim)
    assert rc == 1
    assert report["ok"] is False and report["failed"] == [victim]
    bad = [r for r in report["results"] if not r["ok"]]
    assert [r["kernel"] for r in bad] == [victim]
    assert any("kael_planted_error" in line or "const char" in line for line in bad[0]["errors"]), bad
    assert f"FAILED: ['{victim}']" in err and re.search(rf"FAIL +{victim} +sm_90", err)


def test_plant_error_of_an_unknown_kernel_is_a_usage_error():
    r = subprocess.run(
        [sys.executable, str(SCRIPT), "--plant-error", "no_such_kernel"], capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 2 and "no_such_kernel" in r.stderr and "kael_gelu" in r.stderr


@needs_a_compiler
@pytest.mark.parametrize("compiler", COMPILERS)
def test_name_expressions_instantiate_templates(compiler, tmp_path):
    """An error that only an instantiation reveals (T::nope for T = float) fails; the same template
    without it compiles to one entry per name expression; warnings are reported, not fatal."""
    src = "template <typename T> __global__ void k(T* x) {{ int unused; {extra} x[0] = T(1); }}"
    mk = lambda extra, exprs: cc.Kernel(
        name="k", kind="RawModule", site="t.py:1", code=src.format(extra=extra), options=(), name_expressions=exprs
    )
    bad = _compile(mk("typename T::nope y;", ("k<float>",)), compiler=compiler, tmp=tmp_path)
    assert not bad.ok and any("::" in e for e in bad.errors), bad
    good = _compile(mk("", ("k<float>", "k<double>")), compiler=compiler, tmp=tmp_path)
    assert good.ok, good
    assert sorted(good.entries) == ["void k<double>(double*)", "void k<float>(float*)"]
    assert any("unused" in w for w in good.warnings), good.warnings
    none = _compile(mk("", ()), compiler=compiler, tmp=tmp_path)  # no instance: nothing to run, an error
    assert not none.ok and any("no kernel" in e for e in none.errors)


@needs_a_compiler
@pytest.mark.parametrize("compiler", COMPILERS)
def test_elementwise_wrapping_types_the_body_as_cupy_does(compiler, tmp_path):
    """The parameter types reach the body as CuPy declares them (int32 -> int, float64 -> double, T per
    instance), outputs are writable references and inputs const."""
    body = """
        static_assert(sizeof(n) == 4 && sizeof(lr) == 8 && sizeof(T) == sizeof(x), "types");
        static_assert(sizeof(flag) == 1 && sizeof(big) == 8, "types");
        y = x * (T)lr + (T)n; z = y;"""
    k = cc.Kernel(
        name="kael_check",
        kind="ElementwiseKernel",
        site="t.py:1",
        code=body,
        params=("T x, int32 n, float64 lr, bool flag, uint64 big", "T y, T z", "", "", ""),
    )
    r = _compile(k, compiler=compiler, tmp=tmp_path)
    assert r.ok, r
    assert sorted(e.split("(")[0] for e in r.entries) == ["kael_double::kael_check", "kael_float::kael_check"]
    assign_input = cc.Kernel(**{**k.__dict__, "code": "x = (T)1; y = x;"})
    r = _compile(assign_input, compiler=compiler, tmp=tmp_path)
    assert not r.ok and r.errors  # inputs are const, as in CuPy
    with pytest.raises(cc.DiscoveryError, match="float16"):
        cc.translation_unit(cc.Kernel(**{**k.__dict__, "params": ("float16 x", "T y", "", "", "")}))


def test_nvrtc_options_translate_to_nvcc_or_are_refused():
    assert cc.nvcc_options(("--std=c++14", "-DKAEL=1", "--use_fast_math"), "s:1") == [
        "-std=c++14",
        "-DKAEL=1",
        "--use_fast_math",
    ]
    with pytest.raises(cc.DiscoveryError, match=r"s:1: NVRTC option '-default-device'"):
        cc.nvcc_options(("-default-device",), "s:1")


@needs_a_compiler
def test_with_a_gpu_it_runs_validate_with_the_flags_after_the_separator(monkeypatch, capsys):
    tiny = cc.Kernel(name="k", kind="RawKernel", site="t.py:1", code='extern "C" __global__ void k() {}', entry="k")
    calls: list[list[str]] = []
    monkeypatch.setattr(cc, "discover", lambda: [tiny])
    monkeypatch.setattr(cc, "_gpu_available", lambda: (True, "1 device(s)"))
    real_run = subprocess.run

    def fake_run(cmd, *a, **kw):
        if len(cmd) > 1 and str(cmd[1]).endswith("validate.py"):
            calls.append([str(c) for c in cmd])
            return subprocess.CompletedProcess(cmd, 3)
        return real_run(cmd, *a, **kw)

    monkeypatch.setattr(cc.subprocess, "run", fake_run)
    assert cc.main(["--arch", "sm_80", "--", "--quick", "--no-conformance"]) == 3  # validate's status
    assert calls == [
        [sys.executable, str(ROOT / "kael_backend_cuda" / "scripts" / "validate.py"), "--quick", "--no-conformance"]
    ]
    assert json.loads(capsys.readouterr().out)["ok"] is True
    calls.clear()
    assert cc.main(["--arch", "sm_80", "--no-validate"]) == 0 and calls == []
