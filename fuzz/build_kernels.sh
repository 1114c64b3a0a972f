#!/usr/bin/env bash
# Build kael_backend_cpu's extension for fuzz_kernels: clang with
# -fsanitize=fuzzer-no-link,address,undefined (libFuzzer edge counters + ASan + UBSan),
# the caching allocator compiled out so ASan sees every overflow. Output: build/fuzz-kernels/,
# with build/fuzz-kernels/extension holding the module's path, which fuzz/run.py passes as
# KAEL_CPU_EXTENSION (the installed kael_backend_cpu then loads this build). fuzz/run.py
# calls this; it rebuilds only what changed. The runtime (ASan + libFuzzer) is atheris's asan_with_fuzzer.so, preloaded
# by run.py; the module links none, so its sanitizer symbols resolve to that one.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/_cpu_build.sh
source scripts/_cpu_build.sh

find_clang() {
    local c
    for c in "${FUZZ_CXX:-}" clang++ clang++-19 clang++-18 clang++-17 clang++-16 clang++-15 clang++-14; do
        [[ -n $c ]] && command -v "$c" >/dev/null 2>&1 && { echo "$c"; return 0; }
    done
    echo "build_kernels.sh: fuzz_kernels needs clang++ (apt-get install clang)" >&2
    return 1
}

CXX=$(find_clang)
export CXX
flags="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize=vptr,function -fno-sanitize-recover=undefined"
flags="$flags -fno-omit-frame-pointer -g -DKAEL_NO_CACHING_ALLOCATOR"
BUILD=build/fuzz-kernels
cpu_build "$BUILD" -DCMAKE_CXX_COMPILER="$CXX" -DKAEL_BUILD_TESTS=OFF -DCMAKE_CXX_FLAGS="$flags" >&2
cpu_extension "$BUILD" >"$BUILD/extension"
