"""The CPU backend's vector tables (csrc/vec_select.cpp, NOTE [runtime dispatch] in vec.h).

For every table this CPU runs (baseline, avx2, avx512), a subprocess with KAEL_CPU_ISA set
runs matmul / linear (few-row and packed shapes, float32 and float64), softmax, log_softmax,
layer_norm, gelu, rms_norm, rope, silu_mul, gelu_tanh_mul, softcap, attention and a streamed
add, and the results are compared here with the NumPy reference backend at the conformance kit's tolerances;
rows of a batched product must equal the same rows alone, bit for bit. The selection itself:
the widest runnable table by default, KAEL_CPU_ISA forcing one, CPU features as Linux's
/proc/cpuinfo reports them, KAEL_CPU_DISABLE standing in for a CPU without a feature, and a
BackendError (never a crash) for an unknown name or a table the CPU cannot run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

kbc = pytest.importorskip("kael_backend_cpu")

import kael  # noqa: E402
from kael.testing import assert_close  # noqa: E402
from kael.testing.conformance import KERNEL_TOL  # noqa: E402
from kael_backend_cpu._native import C  # noqa: E402

if not hasattr(C, "isa_info"):
    pytest.skip("this build of kael_backend_cpu has no isa_info (an older extension)", allow_module_level=True)

TABLES = ("baseline", "avx2", "avx512")
HERE = Path(__file__).resolve().parent
# The conformance kit's tolerance for long float32 dot products (its matmul "large" case):
# two float32 sums of k products in different orders differ by about sqrt(k) roundings.
LONG_DOT_TOL = (1e-5, 1e-4)


def native_env(**env: str) -> dict[str, str]:
    """os.environ without KAEL_CPU_ISA, plus env; the native backend serves cpu. KAEL_CPU_DISABLE
    stays: the suite run with e.g. KAEL_CPU_DISABLE=avx512f tests this machine as an AVX2-only one."""
    base = {k: v for k, v in os.environ.items() if k not in ("KAEL_CPU_ISA", "KAEL_BACKEND_CPU")}
    return {**base, **env}


def run_py(code: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code, *args], env=native_env(**env), capture_output=True, text=True, timeout=600
    )


def skip_unless_runnable(name: str) -> None:
    info = C.isa_info()
    if name not in info["tables"]:
        pytest.skip(f"the {name} table is not compiled into this build")
    if name not in info["runnable"]:
        lacking = [f for f in info["requires"][name] if not info["features"][f]]
        pytest.skip(f"this CPU cannot run the {name} table (lacks {', '.join(lacking)})")


# -- the cases: inputs made here, results computed by whichever backend serves cpu --------


def make_inputs(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)

    def f32(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape).astype(np.float32)

    positions = np.stack([rng.permutation(16)[:6], np.arange(6) + 3]).astype(np.int64)
    angles = np.arange(16)[:, None] * (10000.0 ** (-np.arange(32) / 32))[None, :]
    return {
        "x768": f32(12, 768),  # decode/prefill-row activations
        "w768": f32(1000, 768),  # a [out, in] weight: rows contiguous along k
        "b1000": f32(1000),
        "wt768": f32(768, 1000),  # [in, out]: contiguous along n
        "w3072": f32(3072, 768),
        "x300": f32(100, 300),
        "w300": f32(260, 300),
        "b260": f32(260),
        "a129": f32(70, 129),
        "b129": f32(129, 97),
        "bt129": f32(97, 129),
        "a19": f32(37, 19),
        "b19": f32(19, 45),
        "a64": rng.standard_normal((40, 50)),
        "b64": rng.standard_normal((50, 33)),
        "s1000": f32(7, 1000) * 3,
        "s37": f32(3, 37) * 3,
        "ln": f32(6, 771),
        "lnw": f32(771),
        "lnb": f32(771),
        "g": f32(3, 1003) * 2,
        "rms": f32(5, 777),
        "rmsw": f32(777),
        "rope_x": f32(2, 4, 6, 64),
        "rope_cos": np.cos(angles).astype(np.float32),
        "rope_sin": np.sin(angles).astype(np.float32),
        "rope_pos": positions,
        "gate": f32(4, 1001),
        "up": f32(4, 1001),
        "q": f32(2, 4, 5, 64),
        "kv": f32(2, 2, 2, 9, 64),
        "qd": f32(1, 8, 1, 64),
        "kvd": f32(2, 1, 2, 33, 64),
        "big_a": f32(4_200_001),  # 16.8 MB out: the non-temporal store path
        "big_b": f32(4_200_001),
    }


def T(a: np.ndarray) -> kael.Tensor:
    return kael.tensor(a)


def _linear_rows(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    return np.concatenate([kael.ops.linear(T(x[i : i + 1]), T(w)).numpy() for i in range(x.shape[0])])


def _matmul_rows(x: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.concatenate([kael.ops.matmul(T(x[i : i + 1]), T(b)).numpy() for i in range(x.shape[0])])


# name -> (the computation, the dtype of its tolerance, whether it is a float32 product of
# more than a few terms: LONG_DOT_TOL, as the kit's own large matmul case)
CASES: dict[str, tuple[Callable[[dict[str, np.ndarray]], np.ndarray], str, bool]] = {
    "linear_1row": (lambda d: kael.ops.linear(T(d["x768"][:1]), T(d["w768"]), T(d["b1000"])).numpy(), "float32", True),
    "linear_5rows": (
        lambda d: kael.ops.linear(T(d["x768"][:5]), T(d["w768"]), T(d["b1000"])).numpy(),
        "float32",
        True,
    ),
    "linear_packed": (
        lambda d: kael.ops.linear(T(d["x300"]), T(d["w300"]), T(d["b260"])).numpy(),
        "float32",
        True,
    ),
    "matmul_nmajor_1row": (lambda d: kael.ops.matmul(T(d["x768"][:1]), T(d["wt768"])).numpy(), "float32", True),
    "matmul_nmajor_3rows": (lambda d: kael.ops.matmul(T(d["x768"][:3]), T(d["wt768"])).numpy(), "float32", True),
    "matmul_nmajor_9rows": (lambda d: kael.ops.matmul(T(d["x768"][:9]), T(d["wt768"])).numpy(), "float32", True),
    "matmul_packed": (lambda d: kael.ops.matmul(T(d["a129"]), T(d["b129"])).numpy(), "float32", True),
    "matmul_packed_bt": (lambda d: kael.ops.matmul(T(d["a129"]), T(d["bt129"]).T).numpy(), "float32", True),
    "matmul_packed_at": (
        lambda d: kael.ops.matmul(T(np.ascontiguousarray(d["a129"].T)).T, T(d["b129"])).numpy(),
        "float32",
        True,
    ),
    "matmul_edges": (lambda d: kael.ops.matmul(T(d["a19"]), T(d["b19"])).numpy(), "float32", True),
    "matmul_f64_packed": (lambda d: kael.ops.matmul(T(d["a64"]), T(d["b64"])).numpy(), "float64", False),
    "matmul_f64_rows": (lambda d: kael.ops.matmul(T(d["a64"][:3]), T(d["b64"])).numpy(), "float64", False),
    "softmax": (lambda d: kael.ops.softmax(T(d["s1000"])).numpy(), "float32", False),
    "softmax_short": (lambda d: kael.ops.softmax(T(d["s37"])).numpy(), "float32", False),
    "log_softmax": (lambda d: kael.ops.log_softmax(T(d["s1000"])).numpy(), "float32", False),
    "layer_norm": (
        lambda d: kael.ops.layer_norm(T(d["ln"]), (771,), T(d["lnw"]), T(d["lnb"])).numpy(),
        "float32",
        False,
    ),
    "gelu_tanh": (lambda d: kael.ops.gelu(T(d["g"]), approximate="tanh").numpy(), "float32", False),
    "rms_norm": (lambda d: kael.ops.rms_norm(T(d["rms"]), T(d["rmsw"])).numpy(), "float32", False),
    "rope": (
        lambda d: kael.ops.rope(T(d["rope_x"]), T(d["rope_cos"]), T(d["rope_sin"]), T(d["rope_pos"])).numpy(),
        "float32",
        False,
    ),
    "silu_mul": (lambda d: kael.ops.silu_mul(T(d["gate"]), T(d["up"])).numpy(), "float32", False),
    "gelu_tanh_mul": (lambda d: kael.ops.gelu_tanh_mul(T(d["gate"]), T(d["up"])).numpy(), "float32", False),
    "softcap": (lambda d: kael.ops.softcap(T(d["g"]) * 20.0, 30.0).numpy(), "float32", False),
    "attention_causal": (
        lambda d: kael.ops.attention(T(d["q"]), T(d["kv"][0]), T(d["kv"][1]), causal=True).numpy(),
        "float32",
        False,
    ),
    "attention_decode_gqa": (
        lambda d: kael.ops.attention(T(d["qd"]), T(d["kvd"][0]), T(d["kvd"][1])).numpy(),
        "float32",
        False,
    ),
    "add_streamed": (lambda d: kael.ops.add(T(d["big_a"]), T(d["big_b"])).numpy(), "float32", False),
}

# Batched products whose rows must equal the same rows computed alone, bit for bit (up to 16
# rows, NOTE [gemm paths] in gemm.h): name -> (batched, rows alone).
BATCHED: dict[
    str, tuple[Callable[[dict[str, np.ndarray]], np.ndarray], Callable[[dict[str, np.ndarray]], np.ndarray]]
] = {
    "linear_kmajor": (
        lambda d: kael.ops.linear(T(d["x768"]), T(d["w3072"])).numpy(),
        lambda d: _linear_rows(d["x768"], d["w3072"]),
    ),
    "matmul_nmajor": (
        lambda d: kael.ops.matmul(T(d["x768"]), T(d["wt768"])).numpy(),
        lambda d: _matmul_rows(d["x768"], d["wt768"]),
    ),
}


def compute(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    out = {name: fn(inputs) for name, (fn, _, _) in CASES.items()}
    for name, (batched, alone) in BATCHED.items():
        out[f"batched:{name}"] = batched(inputs)
        out[f"alone:{name}"] = alone(inputs)
    return out


# Run in the subprocess: the inputs' file, then the results' file; prints the table's name.
CHILD = f"""
import sys
sys.path.insert(0, {str(HERE)!r})
import numpy as np, kael, kael.cpu
from test_cpu_isa import compute
inputs = dict(np.load(sys.argv[1]))
np.savez(sys.argv[2], **compute(inputs))
print(kael.cpu.backend().name, kael.cpu.isa())
"""


@pytest.fixture(scope="module")
def inputs_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("isa") / "inputs.npz"
    inputs: dict[str, Any] = make_inputs()
    np.savez(path, **inputs)
    return path


@pytest.fixture(scope="module")
def reference(inputs_file: Path) -> Iterator[dict[str, np.ndarray]]:
    """Every case computed by the NumPy reference backend."""
    before = kael.backends.override("cpu")
    kael.backends.use("cpu", "reference")
    try:
        with np.load(inputs_file) as f:
            inputs = dict(f)
        yield {name: fn(inputs) for name, (fn, _, _) in CASES.items()}
    finally:
        kael.backends.use("cpu", before)


@pytest.mark.parametrize("table", TABLES)
def test_every_table_matches_the_reference(
    table: str, inputs_file: Path, reference: dict[str, np.ndarray], tmp_path: Path
) -> None:
    skip_unless_runnable(table)
    results = tmp_path / "results.npz"
    res = run_py(CHILD, str(inputs_file), str(results), KAEL_CPU_ISA=table)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["cpu", table]
    with np.load(results) as f:
        got = dict(f)
    for name, (_, dtype, long_dot) in CASES.items():
        rtol, atol = LONG_DOT_TOL if long_dot else KERNEL_TOL[dtype]
        assert got[name].dtype == reference[name].dtype, name
        assert_close(got[name], reference[name], rtol=rtol, atol=atol, msg=f"{table}: {name}")
    np.testing.assert_array_equal(got["add_streamed"], reference["add_streamed"])  # one rounding: exact
    for name in BATCHED:
        np.testing.assert_array_equal(
            got[f"batched:{name}"], got[f"alone:{name}"], err_msg=f"{table}: {name} rows batched vs alone"
        )


def test_reference_results_are_right() -> None:
    """The oracle itself, for two cases, against float64 NumPy (so a reference bug cannot hide one here)."""
    d = make_inputs()
    before = kael.backends.override("cpu")
    kael.backends.use("cpu", "reference")
    try:
        lin = CASES["linear_5rows"][0](d)
        sm = CASES["softmax"][0](d)
    finally:
        kael.backends.use("cpu", before)
    want = d["x768"][:5].astype(np.float64) @ d["w768"].T.astype(np.float64) + d["b1000"]
    assert_close(lin, want, rtol=LONG_DOT_TOL[0], atol=LONG_DOT_TOL[1])
    s = d["s1000"].astype(np.float64)
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    assert_close(sm, e / e.sum(axis=-1, keepdims=True), rtol=KERNEL_TOL["float32"][0], atol=KERNEL_TOL["float32"][1])


# -- the selection --------------------------------------------------------------------------

INFO = "import json, kael, kael.cpu; print(json.dumps(kael.cpu.isa_info()))"


def child_info(**env: str) -> dict[str, Any]:
    res = run_py(INFO, **env)
    assert res.returncode == 0, res.stderr
    info: dict[str, Any] = json.loads(res.stdout)
    return info


def test_default_is_the_widest_runnable_table() -> None:
    info = child_info()
    assert info["runnable"] and info["runnable"][-1] == "baseline"
    assert info["isa"] == info["runnable"][0] and info["error"] is None and info["requested"] is None
    assert info == C.isa_info() | {k: info[k] for k in ("isa", "error", "requested", "disabled")}  # as here
    assert info["tables"][-1] == "baseline" and set(info["runnable"]) <= set(info["tables"])
    order = [t for t in TABLES[::-1] if t in info["tables"]]
    assert info["tables"] == order  # widest first
    for table in info["tables"]:  # runnable exactly when every requirement is present
        ok = all(info["features"][f] for f in info["requires"][table])
        assert (table in info["runnable"]) == ok, table


@pytest.mark.skipif(not Path("/proc/cpuinfo").exists(), reason="needs Linux's /proc/cpuinfo")
@pytest.mark.skipif(bool(os.environ.get("KAEL_CPU_DISABLE")), reason="KAEL_CPU_DISABLE hides features on purpose")
def test_features_agree_with_proc_cpuinfo() -> None:
    flags: set[str] = set()
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            break
    if not flags:
        pytest.skip("/proc/cpuinfo has no flags line (not x86)")
    features = child_info()["features"]
    for name in ("avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni"):
        assert features[name] == (name in flags), name
    assert features["avx512_bf16"] == ("avx512_bf16" in flags)
    assert features["amx_bf16"] == ("amx_bf16" in flags and "amx_tile" in flags)
    # Linux lists avx / avx512f / amx_tile only when it saves their registers (XCR0); it grants the tile state to
    # every process that asks (arch_prctl, Linux 5.16 on: this kernel lists the flag only when it can)
    assert features["os_avx"] == ("avx" in flags)
    assert features["os_avx512"] == ("avx512f" in flags)
    assert features["os_amx"] == ("amx_bf16" in flags and "amx_tile" in flags)


@pytest.mark.parametrize("name", ["baseline", "base", "avx2", "avx512"])
def test_kael_cpu_isa_forces_a_table(name: str) -> None:
    table = "baseline" if name == "base" else name
    skip_unless_runnable(table)
    info = child_info(KAEL_CPU_ISA=name)
    assert info["isa"] == table and info["requested"] == name and info["error"] is None


def refused(code: str, **env: str) -> str:
    """Run code expecting a BackendError; return its message."""
    probe = f"""
import kael, kael.cpu
try:
    {code}
except kael.BackendError as exc:
    print(str(exc))
else:
    raise SystemExit("no BackendError")
"""
    res = run_py(probe, **env)
    assert res.returncode == 0, res.stderr
    return res.stdout.strip()


SOFTMAX = "kael.ops.softmax(kael.tensor([[1.0, 2.0, 3.0]]))"


@pytest.mark.parametrize("value", ["avx9", "AVX2", "native", " avx2"])
def test_unknown_name_is_a_backend_error(value: str) -> None:
    for code in ("kael.cpu.isa()", SOFTMAX):
        msg = refused(code, KAEL_CPU_ISA=value)
        assert f"KAEL_CPU_ISA='{value}'" in msg and "unknown vector table" in msg, msg
        assert "expected baseline (or base), avx2 or avx512" in msg, msg
    info = child_info(KAEL_CPU_ISA=value)  # isa_info reports instead of raising
    assert info["isa"] is None and "unknown vector table" in info["error"]


def test_a_table_the_cpu_lacks_is_a_backend_error() -> None:
    """KAEL_CPU_DISABLE stands in for an older CPU: no AVX-512BW, then no FMA."""
    skip_unless_runnable("avx2")
    info = child_info(KAEL_CPU_DISABLE="avx512bw")
    assert info["features"]["avx512bw"] is False and info["disabled"] == "avx512bw"
    assert info["isa"] == "avx2" and "avx512" not in info["runnable"]  # an AVX2-only machine's choice
    if "avx512" in info["tables"]:
        for code in ("kael.cpu.isa()", SOFTMAX):
            msg = refused(code, KAEL_CPU_ISA="avx512", KAEL_CPU_DISABLE="avx512bw")
            assert "KAEL_CPU_ISA='avx512': this CPU cannot run the avx512 table (lacks " in msg, msg
            assert "avx512bw" in msg.split("(lacks ")[1].split(")")[0], msg
            assert "the tables it runs: avx2, baseline" in msg, msg
    msg = refused("kael.cpu.isa()", KAEL_CPU_ISA="avx2", KAEL_CPU_DISABLE="fma,os_avx512")
    assert "cannot run the avx2 table (lacks fma)" in msg and "runs: baseline" in msg, msg
    assert child_info(KAEL_CPU_DISABLE="fma")["isa"] == "baseline"


def test_unknown_disabled_feature_is_a_backend_error() -> None:
    msg = refused(SOFTMAX, KAEL_CPU_DISABLE="avx512f,sse9")
    assert "KAEL_CPU_DISABLE='avx512f,sse9': unknown CPU feature 'sse9'" in msg and "avx512_bf16" in msg, msg


def test_python_m_kael_info_names_the_table() -> None:
    info = child_info()
    res = subprocess.run(
        [sys.executable, "-m", "kael", "info"], env=native_env(), capture_output=True, text=True, timeout=300
    )
    assert res.returncode == 0, res.stderr
    disabled = f" (KAEL_CPU_DISABLE={info['disabled']})" if info["disabled"] else ""
    assert f"cpu vector table: {info['isa']}{disabled}\n" in res.stdout
    assert f"this CPU runs: {', '.join(info['runnable'])}" in res.stdout
    res = subprocess.run(
        [sys.executable, "-m", "kael", "info"],
        env=native_env(KAEL_CPU_ISA="avx9"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr
    forced = ", ".join(["KAEL_CPU_ISA=avx9", *([f"KAEL_CPU_DISABLE={info['disabled']}"] if info["disabled"] else [])])
    assert f"cpu vector table: none ({forced}): " in res.stdout
    assert "KAEL_CPU_ISA='avx9': unknown vector table" in res.stdout
