"""The CUDA C of kael-backend-cuda's weight-format kernels, run on the host without a GPU.

``QUANT_KERNELS_SOURCE`` is compiled by g++ with the CUDA keywords defined away: the
dequantize kernels run one "thread" after another, ``kael_weight_value`` (what the fused
``kael_qlinear_<scheme>`` decodes) is called for every value of a row, and those kernels run
with one host thread per CUDA thread, ``__shfl_xor_sync`` emulated through a per-warp barrier.
Oracles: ``gguf.quants.dequantize`` for every block format, NumPy's float16 and the bfloat16 bit
shift, float64 NumPy products.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from kael_backend_cuda import _quant

gguf = pytest.importorskip("gguf")


_HOST_PRELUDE = r"""
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
struct kael_dim3 { long long x, y, z; };
static kael_dim3 blockIdx, threadIdx, blockDim;
#define __device__
#define __global__
#define __constant__
#define __forceinline__ inline
#define __restrict__
static inline float __uint_as_float(unsigned int u) { float f; std::memcpy(&f, &u, 4); return f; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __shfl_xor_sync(unsigned int, float, int) { std::abort(); }  // kael_qlinear_*: not run here
"""


def _host_main() -> str:
    """main(): prog INDEX NBLOCKS < blocks > values, running every "thread" of dequantize kernel INDEX in turn."""
    names = list(_quant.BLOCK_BYTES)
    return f"""
typedef void (*kael_dequantize_fn)(const unsigned char*, float*, long long);
static const kael_dequantize_fn kernels[] = {{{", ".join(f"kael_dequantize_{s}" for s in names)}}};
static const long long values[] = {{{", ".join(str(_quant.BLOCK_VALUES[s]) for s in names)}}};
static const long long bytes[] = {{{", ".join(str(_quant.BLOCK_BYTES[s]) for s in names)}}};
// prog row CODE N K ROW_BYTES < rows > values: kael_weight_value (what kael_qlinear_* reads) of every value
static int weight_values(char** argv) {{
    const int code = std::atoi(argv[2]);
    const long long n = std::atoll(argv[3]), k = std::atoll(argv[4]), row_bytes = std::atoll(argv[5]);
    std::vector<unsigned char> w(n * row_bytes);
    std::vector<float> out(n * k);
    if (std::fread(w.data(), 1, w.size(), stdin) != w.size()) return 2;
    for (long long r = 0; r < n; ++r)
        for (long long j = 0; j < k; ++j) out[r * k + j] = kael_weight_value(w.data() + r * row_bytes, j, code);
    std::fwrite(out.data(), 4, out.size(), stdout);
    return 0;
}}

int main(int argc, char** argv) {{
    if (argc == 6 && std::strcmp(argv[1], "row") == 0) return weight_values(argv);
    const int s = std::atoi(argv[1]);
    const long long nblocks = std::atoll(argv[2]), n = nblocks * values[s];
    std::vector<unsigned char> w(nblocks * bytes[s]);
    std::vector<float> out(n);
    if (std::fread(w.data(), 1, w.size(), stdin) != w.size()) return 2;
    blockDim.x = 256;
    for (blockIdx.x = 0; blockIdx.x * 256 < n; ++blockIdx.x)
        for (threadIdx.x = 0; threadIdx.x < 256; ++threadIdx.x) kernels[s](w.data(), out.data(), n);
    std::fwrite(out.data(), 4, out.size(), stdout);
    return 0;
}}
"""


@pytest.fixture(scope="module")
def host_kernels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The dequantize kernels of QUANT_KERNELS_SOURCE built for the host with g++ (no contraction of
    a*b + c into fused multiply-adds, as the CUDA source forbids it with __fmul_rn/__fadd_rn)."""
    cxx = shutil.which("g++")
    if cxx is None:
        pytest.skip("g++ is not on PATH")
    d = tmp_path_factory.mktemp("quant_host")
    src = _quant.QUANT_KERNELS_SOURCE.replace('extern "C" {', "").replace('}  // extern "C"', "")
    (d / "k.cpp").write_text(_HOST_PRELUDE + src + _host_main())
    r = subprocess.run(
        [cxx, "-O1", "-std=c++14", "-ffp-contract=off", str(d / "k.cpp"), "-o", str(d / "k")],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    return d / "k"


# Byte offset of each format's float16 scale d (every bit pattern of it is tried there).
_D_AT = {"q2_k": 80, "q3_k": 108, "q6_k": 208}


@pytest.mark.parametrize("scheme", list(_quant.BLOCK_BYTES))
def test_cuda_dequantize_source_run_on_the_host(host_kernels, scheme):
    """The CUDA C itself, one "thread" at a time: gguf's values for random bytes (any scale, NaN and
    infinity included) and every float16 bit pattern of the scale d."""
    rng = np.random.default_rng(8)
    nb = _quant.BLOCK_BYTES[scheme]
    raw = rng.integers(0, 256, (65536 + 37, nb), dtype=np.uint8)
    at = _D_AT.get(scheme, 0)
    raw[:65536, at : at + 2] = np.arange(65536, dtype="<u2").view(np.uint8).reshape(-1, 2)
    r = subprocess.run(
        [str(host_kernels), str(list(_quant.BLOCK_BYTES).index(scheme)), str(len(raw))],
        input=raw.tobytes(),
        capture_output=True,
        timeout=300,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    got = np.frombuffer(r.stdout, np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        want = np.asarray(gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[scheme.upper()]), np.float32)
    np.testing.assert_array_equal(got, want.reshape(-1))


@pytest.mark.parametrize("scheme", list(_quant.SCHEME_CODES))
def test_cuda_weight_value_run_on_the_host(host_kernels, scheme):
    """kael_weight_value, the decoder kael_qlinear_<scheme> calls for value k of a weight row, run on the host for
    every scheme code over rows of several blocks: gguf's values (block formats), NumPy's float16 and
    the bfloat16 bit shift."""
    rng = np.random.default_rng(9)
    n = 3
    if scheme in _quant.BLOCK_BYTES:
        k = 3 * _quant.BLOCK_VALUES[scheme]
        raw = rng.integers(0, 256, (n, k // _quant.BLOCK_VALUES[scheme] * _quant.BLOCK_BYTES[scheme]), np.uint8)
        with np.errstate(invalid="ignore", over="ignore"):
            want = np.asarray(gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[scheme.upper()]), np.float32)
    else:
        k = 77
        raw = rng.integers(0, 256, (n, 2 * k), np.uint8)
        bits = raw.view("<u2")
        want = (
            (bits.astype(np.uint32) << 16).view(np.float32) if scheme == "bf16" else bits.view("<f2").astype(np.float32)
        )
    r = subprocess.run(
        [str(host_kernels), "row", str(_quant.SCHEME_CODES[scheme]), str(n), str(k), str(raw.shape[1])],
        input=raw.tobytes(),
        capture_output=True,
        timeout=300,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    np.testing.assert_array_equal(np.frombuffer(r.stdout, np.float32).reshape(n, k), want.reshape(n, k))


_THREADED_PRELUDE = r"""
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>
struct kael_dim3 { long long x, y, z; };
static kael_dim3 blockIdx, blockDim;
static thread_local kael_dim3 threadIdx;
#define __device__
#define __global__
#define __constant__
#define __forceinline__ inline
#define __restrict__
static inline float __uint_as_float(unsigned int u) { float f; std::memcpy(&f, &u, 4); return f; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
// One barrier per warp: the 32 lanes of a warp meet at every shuffle.
struct kael_warp_barrier {
    std::mutex m;
    std::condition_variable cv;
    int count = 0;
    long long generation = 0;
    void wait() {
        std::unique_lock<std::mutex> lock(m);
        const long long g = generation;
        if (++count == 32) { count = 0; ++generation; cv.notify_all(); }
        else cv.wait(lock, [&] { return generation != g; });
    }
};
static kael_warp_barrier kael_barriers[8];
static float kael_lanes[8][32];
static float __shfl_xor_sync(unsigned int, float v, int o) {
    const int w = (int)(threadIdx.x >> 5), l = (int)(threadIdx.x & 31);
    kael_lanes[w][l] = v;
    kael_barriers[w].wait();
    const float r = kael_lanes[w][l ^ o];
    kael_barriers[w].wait();
    return r;
}
"""


def _qlinear_main() -> str:
    """main(): one launch of kael_qlinear_<scheme> (by scheme code) over quantized_linear's grid."""
    table = ", ".join(f"kael_qlinear_{s}" for s in _quant.QUANT_SCHEMES)
    return _QLINEAR_MAIN.replace("KAEL_TABLE", table)


_QLINEAR_MAIN = r"""
typedef void (*kael_qlinear_fn)(const float*, const unsigned char*, const float*, float*, long long, long long,
                                long long, long long, int);
static const kael_qlinear_fn kernels[] = {KAEL_TABLE};
// prog CODE ROWS K N ROW_BYTES HAS_BIAS < x (float32) w (bytes) bias (float32) > out: one launch of kael_qlinear_*
// over the grid quantized_linear uses, each block's 256 threads as host threads.
int main(int argc, char** argv) {
    const int code = std::atoi(argv[1]), has_bias = std::atoi(argv[6]);
    const long long rows = std::atoll(argv[2]), k = std::atoll(argv[3]), n = std::atoll(argv[4]);
    const long long row_bytes = std::atoll(argv[5]);
    std::vector<float> x(rows * k), bias(n), out(rows * n, -1.0f);
    std::vector<unsigned char> w(n * row_bytes);
    if (std::fread(x.data(), 4, x.size(), stdin) != x.size()) return 2;
    if (std::fread(w.data(), 1, w.size(), stdin) != w.size()) return 2;
    if (has_bias && std::fread(bias.data(), 4, bias.size(), stdin) != bias.size()) return 2;
    blockDim.x = 256;
    for (blockIdx.y = 0; blockIdx.y < (rows + KAEL_QROWS - 1) / KAEL_QROWS; ++blockIdx.y)
        for (blockIdx.x = 0; blockIdx.x < (n + 7) / 8; ++blockIdx.x) {
            std::vector<std::thread> threads;
            for (int t = 0; t < 256; ++t)
                threads.emplace_back([&, t] {
                    threadIdx.x = t;
                    kernels[code](x.data(), w.data(), bias.data(), out.data(), rows, k, n, row_bytes, has_bias);
                });
            for (auto& th : threads) th.join();
        }
    std::fwrite(out.data(), 4, out.size(), stdout);
    return 0;
}
"""


@pytest.fixture(scope="module")
def host_qlinear(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The kael_qlinear_<scheme> kernels of QUANT_KERNELS_SOURCE built for the host (threads for CUDA threads)."""
    cxx = shutil.which("g++")
    if cxx is None:
        pytest.skip("g++ is not on PATH")
    d = tmp_path_factory.mktemp("qlinear_host")
    src = _quant.QUANT_KERNELS_SOURCE.replace('extern "C" {', "").replace('}  // extern "C"', "")
    (d / "q.cpp").write_text(_THREADED_PRELUDE + src + _qlinear_main())
    r = subprocess.run(
        [cxx, "-O1", "-std=c++14", "-ffp-contract=off", "-pthread", str(d / "q.cpp"), "-o", str(d / "q")],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    return d / "q"


def _run_qlinear(prog: Path, scheme: str, x: np.ndarray, w: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
    rows, k = x.shape
    n = w.shape[0]
    args = [str(_quant.SCHEME_CODES[scheme]), str(rows), str(k), str(n), str(w.shape[1]), str(int(bias is not None))]
    data = (
        x.astype(np.float32).tobytes() + w.tobytes() + (bias.astype(np.float32).tobytes() if bias is not None else b"")
    )
    r = subprocess.run([str(prog), *args], input=data, capture_output=True, timeout=300, check=False)
    assert r.returncode == 0, r.stderr
    return np.frombuffer(r.stdout, np.float32).reshape(rows, n)


@pytest.mark.parametrize("scheme", list(_quant.SCHEME_CODES))
def test_cuda_qlinear_run_on_the_host(host_qlinear, scheme):
    """The fused few-row kernel itself: float64's answer within float32 rounding for 1..6 rows (a partial
    last group of QROWS rows included), each row bit for bit what it gives alone, bias added."""
    rng = np.random.default_rng(10)
    n = 13  # two blocks of 8 warps, the second one partial
    if scheme in ("f16", "bf16"):
        k = 72
        a = (rng.standard_normal((n, k)) * 0.1).astype(np.float32)
        bits = a.astype("<f2").view("<u2") if scheme == "f16" else (a.view(np.uint32) >> 16).astype("<u2")
        w = bits.view(np.uint8).reshape(n, -1)
        wf = bits.view("<f2").astype(np.float32) if scheme == "f16" else (bits.astype(np.uint32) << 16).view(np.float32)
    else:
        v, b = _quant.BLOCK_VALUES[scheme], _quant.BLOCK_BYTES[scheme]
        k = 2 * v
        w = rng.integers(0, 256, (n, k // v * b), np.uint8)
        at = {"q2_k": (80, 82), "q3_k": (108,), "q6_k": (208,)}.get(scheme, (0, 2))  # d (and dmin / m)
        blocks = w.reshape(-1, b)
        for o in at:  # moderate finite scales
            blocks[:, o : o + 2] = (
                (rng.choice([0.01, -0.003, 0.02], len(blocks)).astype("<f2")).view(np.uint8).reshape(-1, 2)
            )
        wf = np.asarray(gguf.quants.dequantize(w, gguf.GGMLQuantizationType[scheme.upper()]), np.float32)
    x = rng.standard_normal((6, k)).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    got = _run_qlinear(host_qlinear, scheme, x, w, bias)
    want = x.astype(np.float64) @ wf.astype(np.float64).T + bias
    bound = 1e-5 * (np.abs(x).astype(np.float64) @ np.abs(wf).T.astype(np.float64)) + 1e-6
    assert np.all(np.abs(got - want) <= bound)
    for i in (0, 3, 5):
        np.testing.assert_array_equal(_run_qlinear(host_qlinear, scheme, x[i : i + 1], w, bias)[0], got[i])
    plain = _run_qlinear(host_qlinear, scheme, x[1:4], w, None)  # no bias: rows 1..3, one partial group
    assert np.all(np.abs(plain - (want[1:4] - bias)) <= bound[1:4])
    np.testing.assert_array_equal(_run_qlinear(host_qlinear, scheme, x[2:3], w, None)[0], plain[1])
