#!/usr/bin/env bash
# Sanitizer runs of kael's native code (kael_backend_cpu).
#
#   bash scripts/sanitizers.sh asan    ASan+UBSan: the C++ tests (ctest), then the Python
#                                      conformance kit with the ASan-built extension loaded
#   bash scripts/sanitizers.sh tsan    TSan: the C++ tests (ctest)
#
# Builds go to build/asan/ and build/tsan/ (or $KAEL_ASAN_BUILD, $KAEL_TSAN_BUILD), with the
# CMake options KAEL_ENABLE_SANITIZERS and KAEL_ENABLE_TSAN of kael_backend_cpu/CMakeLists.txt,
# which also turn the caching allocator off so every overflow and race is seen.
#
# The Python pass preloads the ASan runtime of the compiler that built the extension (Python
# itself is not instrumented), uses PYTHONMALLOC=malloc so Python's allocations go through
# ASan too, and turns leak detection off (the interpreter keeps memory until exit by design):
#
#   LD_PRELOAD="$(gcc -print-file-name=libasan.so) $(gcc -print-file-name=libstdc++.so)" \
#       PYTHONMALLOC=malloc ASAN_OPTIONS=detect_leaks=0 \
#       KAEL_CPU_EXTENSION=$(ls build/asan/_C*.so) \
#       python -m pytest --pyargs kael.testing.conformance --kael-backend cpu
#
# Any sanitizer report stops the process with a non-zero exit (halt_on_error), so the
# script fails on a finding. Compiler: $CXX (default g++). The Python pass loads the ASan
# build through KAEL_CPU_EXTENSION, so kael_backend_cpu must be installed (any build).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/_cpu_build.sh
source scripts/_cpu_build.sh

export CXX=${CXX:-g++}
UBSAN="print_stacktrace=1:halt_on_error=1"
ASAN_BUILD=${KAEL_ASAN_BUILD:-build/asan}
TSAN_BUILD=${KAEL_TSAN_BUILD:-build/tsan}

asan_preload() {  # what Python must preload: the shared ASan runtime of $CXX, and libstdc++
    # libstdc++ too: an interpreter that is not C++ has no __cxa_throw when ASan starts, and
    # ASan's interceptor then aborts at the first C++ exception (a KaelError thrown in C++).
    local name=libasan.so
    if "$CXX" --version | grep -qi clang; then
        name=libclang_rt.asan-$(uname -m).so
    fi
    local runtime stdcxx
    runtime=$("$CXX" -print-file-name="$name")
    stdcxx=$("$CXX" -print-file-name=libstdc++.so)
    [[ -f $runtime ]] || { echo "sanitizers.sh: $CXX has no $name" >&2; return 1; }
    echo "$runtime $stdcxx"
}

no_aslr() {  # TSan maps fixed address ranges: run without address randomisation when possible
    if command -v setarch >/dev/null 2>&1 && setarch "$(uname -m)" -R true 2>/dev/null; then
        setarch "$(uname -m)" -R "$@"
    else
        "$@"
    fi
}

run_asan() {
    cpu_build "$ASAN_BUILD" -DKAEL_ENABLE_SANITIZERS=ON
    echo "==> sanitizers: C++ tests under ASan+UBSan"
    ASAN_OPTIONS="detect_leaks=1:halt_on_error=1:detect_stack_use_after_return=1:strict_init_order=1" \
        UBSAN_OPTIONS=$UBSAN ctest --test-dir "$ASAN_BUILD" --output-on-failure --timeout 600 -j "$JOBS"
    echo "==> sanitizers: Python conformance kit with the ASan+UBSan extension"
    local preload
    preload=$(asan_preload)
    LD_PRELOAD=$preload PYTHONMALLOC=malloc ASAN_OPTIONS="detect_leaks=0:halt_on_error=1" UBSAN_OPTIONS=$UBSAN \
        KAEL_NO_CACHING_ALLOCATOR=1 \
        cpu_python "$ASAN_BUILD" -m pytest --pyargs kael.testing.conformance --kael-backend cpu -q -p no:cacheprovider \
        "${PYTEST_ARGS[@]}"
}

run_tsan() {
    cpu_build "$TSAN_BUILD" -DKAEL_ENABLE_TSAN=ON -DKAEL_BUILD_PYTHON=OFF
    echo "==> sanitizers: C++ tests under TSan"
    TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1" no_aslr ctest --test-dir "$TSAN_BUILD" --output-on-failure --timeout 600
}

mode=${1:-}
shift || true
PYTEST_ARGS=("$@")
case $mode in
    asan) run_asan ;;
    tsan) run_tsan ;;
    *)
        echo "usage: bash scripts/sanitizers.sh asan|tsan [extra pytest arguments for the asan Python pass]" >&2
        exit 2
        ;;
esac
