"""Run a CUDA C kernel source on the host, for tests on machines without a GPU.

The source is compiled with g++ (C++20) after a prelude that gives the CUDA names a host meaning:
a block's threads are ``std::thread``s (blocks run one after another), ``__shared__`` variables are
statics (so one block's threads share them), ``__syncthreads`` is a ``std::barrier`` over the
block, ``__shfl_xor_sync`` exchanges values through a per-warp buffer between two barriers of
the warp's 32 threads, and the bit casts are ``memcpy``s. Each template instance named (CuPy's
name expressions) gets an ``extern "C"`` launcher whose arguments are read from an array of
pointers, their types those of the kernel's parameters with the template argument substituted.

``HostModule(source, names).get_function(name)`` then behaves as CuPy's
``RawModule.get_function``: ``f(grid, block, args)`` with NumPy arrays for device pointers (their
data pointers are passed, strides are the kernel's business) and NumPy scalars for values.
It runs the kernel's own arithmetic, branches, indexing and barriers; it does not model warp
divergence, memory coalescing or the GPU's floating-point contraction choices (g++ may fuse
differently from nvcc, so results agree with the GPU's to rounding, not bit for bit).
"""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["HostModule", "available"]

_PRELUDE = r"""
#include <barrier>
#include <cstring>
#include <functional>
#include <math.h>
#include <memory>
#include <thread>
#include <type_traits>
#include <vector>

struct dim3 {
    unsigned x = 1, y = 1, z = 1;
};
static thread_local dim3 threadIdx, blockIdx;
static dim3 blockDim, gridDim;
static std::barrier<>* kael_host_block;
struct kael_host_warp {
    std::barrier<> bar{32};
    double v[32];
};
static std::vector<std::unique_ptr<kael_host_warp>> kael_host_warps;

#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static

inline void __syncthreads() { kael_host_block->arrive_and_wait(); }
inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
inline float __uint_as_float(unsigned i) { float f; std::memcpy(&f, &i, 4); return f; }
inline double __longlong_as_double(long long i) { double d; std::memcpy(&d, &i, 8); return d; }
template <typename T> T __shfl_xor_sync(unsigned, T v, int o) {
    kael_host_warp& w = *kael_host_warps[threadIdx.x / 32];
    const unsigned lane = threadIdx.x % 32;
    w.v[lane] = (double)v;  // float and double values survive the round trip exactly
    w.bar.arrive_and_wait();
    const double r = w.v[lane ^ (unsigned)o];
    w.bar.arrive_and_wait();
    return (T)r;
}

// 0 when argument j's description (sizes[j]: -itemsize for an array, the value's size otherwise; floats[j]: a
// floating-point value) fits parameter type P, else j + 1.
template <typename P> int kael_host_check(int j, const long long* sizes, const int* floats) {
    typedef std::remove_cv_t<std::remove_pointer_t<P>> E;
    const long long want = std::is_pointer_v<P> ? -(long long)sizeof(E) : (long long)sizeof(P);
    if (sizes[j] != want) return j + 1;
    if (!std::is_pointer_v<P> && floats[j] != (int)std::is_floating_point_v<P>) return j + 1;
    return 0;
}

static void kael_host_run(unsigned gx, unsigned gy, unsigned bx, const std::function<void()>& kernel) {
    gridDim = dim3{gx, gy, 1};
    blockDim = dim3{bx, 1, 1};
    for (unsigned by = 0; by < gy; ++by) {
        for (unsigned b = 0; b < gx; ++b) {
            std::barrier<> block(bx);
            kael_host_block = &block;
            kael_host_warps.clear();
            for (unsigned w = 0; w < (bx + 31) / 32; ++w) kael_host_warps.emplace_back(new kael_host_warp());
            std::vector<std::thread> threads;
            for (unsigned t = 0; t < bx; ++t) {
                threads.emplace_back([&, t] {
                    blockIdx = dim3{b, by, 1};
                    threadIdx = dim3{t, 0, 1};
                    kernel();
                    block.arrive_and_drop();  // a thread that returned no longer holds back the others
                });
            }
            for (auto& th : threads) th.join();
        }
    }
}
"""


def available() -> str | None:
    """None when g++ can build the harness here, else why not."""
    if shutil.which("g++") is None:
        return "g++ is not on PATH"
    return None


def _params(source: str, fn: str) -> tuple[str, list[str]]:
    """(the template parameter's name, the parameter types) of ``template <typename X> __global__ void fn(...)``."""
    m = re.search(rf"template\s*<typename (\w+)>\s*__global__\s+void\s+{fn}\s*\(([^)]*)\)", source)
    assert m, fn
    types = [" ".join(p.split()[:-1]) for p in m.group(2).replace("\n", " ").split(",")]
    return m.group(1), types


class HostModule:
    """A kernel source compiled for the host, with a launcher per name expression (``fn<type>``)."""

    def __init__(self, source: str, names: tuple[str, ...] | list[str], workdir: Path) -> None:
        stubs = []
        self._symbols: dict[str, str] = {}
        self.params: dict[str, list[str]] = {}  # each instance's parameter types, the template argument substituted
        for i, name in enumerate(names):
            fn, targ = re.fullmatch(r"(\w+)<(.+)>", name).groups()  # type: ignore[union-attr]
            tparam, types = _params(source, fn)
            types = [re.sub(rf"\b{tparam}\b", targ, t) for t in types]
            call = ", ".join(f"*({t}*)a[{j}]" for j, t in enumerate(types))
            checks = "".join(f"if (int r = kael_host_check<{t}>({j}, s, f)) return r;\n" for j, t in enumerate(types))
            sym = f"kael_host_launch_{i}"
            stubs.append(
                f'extern "C" int {sym}(unsigned gx, unsigned gy, unsigned bx, void** a, const long long* s, '
                f"const int* f) {{\n{checks}kael_host_run(gx, gy, bx, [&] {{ {fn}<{targ}>({call}); }});\nreturn 0;\n}}"
            )
            self.params[name] = types
            self._symbols[name] = sym
        cpp = workdir / "kernels.cpp"
        cpp.write_text(_PRELUDE + source + "\n" + "\n".join(stubs) + "\n")
        lib = workdir / "kernels.so"
        r = subprocess.run(
            ["g++", "-std=c++20", "-O1", "-fPIC", "-shared", "-pthread", "-w", str(cpp), "-o", str(lib)],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert r.returncode == 0, r.stderr[-4000:]
        self._lib = ctypes.CDLL(str(lib))

    def get_function(self, name: str) -> Any:
        """CuPy's ``RawModule.get_function``: ``f(grid, block, args)``; an argument whose kind (array or value,
        size, float or integer) does not fit the kernel's parameter fails the assertion, naming it."""
        fn = getattr(self._lib, self._symbols[name])
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_uint] * 3 + [ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p, ctypes.c_void_p]
        params = self.params[name]

        def launch(grid: tuple[int, ...], block: tuple[int, ...], args: tuple[Any, ...]) -> None:
            assert len(args) == len(params), (name, params, args)
            keep: list[Any] = []
            slots = (ctypes.c_void_p * len(args))()
            sizes = np.zeros(len(args), np.int64)
            floats = np.zeros(len(args), np.int32)
            for i, a in enumerate(args):
                if isinstance(a, np.ndarray):
                    ptr = ctypes.c_void_p(a.ctypes.data)  # the pointer value, passed by address
                    keep.append(ptr)
                    slots[i] = ctypes.addressof(ptr)
                    sizes[i] = -a.itemsize
                else:
                    assert isinstance(a, np.generic), (name, i, params[i], type(a))  # a C-width NumPy scalar
                    box = np.array(a)
                    keep.append(box)
                    slots[i] = box.ctypes.data
                    sizes[i], floats[i] = box.itemsize, box.dtype.kind == "f"
            gx, gy = (tuple(grid) + (1, 1))[:2]
            bad = fn(gx, gy, block[0], slots, sizes.ctypes.data, floats.ctypes.data)
            assert bad == 0, f"{name}: argument {bad - 1} ({args[bad - 1]!r}) does not fit {params[bad - 1]!r}"

        return launch
