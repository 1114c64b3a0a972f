#!/usr/bin/env bash
# Build, ONCE into a cache outside the clone, everything the llama.cpp comparisons need, from the
# llama.cpp vendored in the llama-cpp-python 0.3.36 sdist, in ONE cmake build (scikit-build-core's
# build of the wheel with llama.cpp's tools switched on, so the wheel's shared libraries and the
# tools are compiled once, through ccache):
#
#   $CACHE/wheel/llama_cpp_python-0.3.36-*.whl   `pip install` of it takes seconds
#   $CACHE/bin/llama-{quantize,tokenize,server,bench} (+ the shared libraries they load, RPATH $ORIGIN)
#   $CACHE/src/{convert_hf_to_gguf.py,conversion,gguf-py}   llama.cpp's converter, what it imports
#   $CACHE/COMPLETE                              written last, with the build's stamp (version and
#                                                compiler flags); a cache without it, or with
#                                                another stamp, is never used
#
# The wheel is built with LLAVA_BUILD=OFF: llama.cpp's tools (LLAMA_BUILD_TOOLS=ON) already add
# tools/mtmd, which the package's own CMakeLists would add a second time (a CMake error), so the
# wheel has no libmtmd (llama_cpp.mtmd_cpp, multimodal chat handlers; no test uses them).
# Measured cold (2 shared cores, nice 10, 6 other engineers' work): 7 min 35 s wall in all.
#
# CACHE = ${KAEL_LLAMA_CPP_CACHE:-$HOME/.cache/kael/llama.cpp-0.3.36}. A complete cache is reused
# (the script prints its path and exits). The build happens in a temporary sibling directory that
# is renamed into place at the end, so a killed build leaves nothing half-written. ccache's store
# is ${CCACHE_DIR:-$(dirname CACHE)/ccache}, kept across rebuilds.
# tests/llama_cpp_tools.py finds these files (KAEL_LLAMA_CPP_BIN / KAEL_LLAMA_CPP_DIR override).
#
# Usage: scripts/build_llama_cpp.sh [--install] [SDIST.tar.gz]
#   --install  also pip install the cached wheel (and its small dependencies) and sentencepiece,
#              which the converter needs
#   SDIST      llama_cpp_python-0.3.36.tar.gz already downloaded (else $KAEL_LLAMA_CPP_SDIST,
#              else `pip download` of exactly that version)
#   JOBS=N parallel compile jobs (default: the number of CPUs); NICE=N (default 10) the niceness
set -euo pipefail
cd "$(dirname "$0")/.."
version=0.3.36
cache=${KAEL_LLAMA_CPP_CACHE:-$HOME/.cache/kael/llama.cpp-$version}
jobs=${JOBS:-$(nproc)}
nice_level=${NICE:-10}
install=0
if [[ ${1:-} == --install ]]; then install=1; shift; fi
sdist=${1:-${KAEL_LLAMA_CPP_SDIST:-}}

install_wheel() {
    if (( install )); then
        echo "==> pip install $cache/wheel/*.whl"
        local wheel=("$cache"/wheel/llama_cpp_python-"$version"-*.whl)
        # The wheel itself always replaces what is installed; its dependencies only when missing.
        python -m pip install -q --no-deps --force-reinstall "${wheel[@]}"
        python -m pip install -q "${wheel[@]}"
        # convert_hf_to_gguf.py reads SentencePiece vocabularies (Llama-family models) with it.
        python -m pip install -q "sentencepiece>=0.1.98,<0.3"
    fi
}

# AMX off: -march=native turns on ggml's AMX kernels (Q4_0, Q4_1, Q8_0, K-quants) on CPUs that list
# amx_tile, and on the hosts here (virtual machines whose kernel lists the flags) their first tile
# instruction traps: SIGILL at `tilezero` in ggml_backend_amx_mul_mat, which kills llama-bench, llama-server
# and the comparison tests. Without AMX llama.cpp takes the same AVX-512 VNNI kernels as on every other
# AVX-512 host. The flags are part of the cache's stamp, so a cache built otherwise is built again.
extra_flags="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
stamp="$version cflags: $extra_flags"

if [[ -f $cache/COMPLETE ]] && grep -qxF "$stamp" "$cache/COMPLETE"; then
    echo "==> llama.cpp $version: cached in $cache"
    install_wheel
    exit 0
fi

parent=$(dirname "$cache")
mkdir -p "$parent"
tmp=$(mktemp -d "$cache.tmp.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
export CCACHE_DIR=${CCACHE_DIR:-$parent/ccache}
# The build directory is a fresh temporary one each time: hash relative paths so ccache still hits.
export CCACHE_BASEDIR=$tmp CCACHE_NOHASHDIR=1

if [[ -z $sdist ]]; then
    echo "==> pip download llama-cpp-python==$version (sdist)"
    python -m pip download -q --no-deps --no-binary llama-cpp-python --no-build-isolation \
        -d "$tmp/download" "llama-cpp-python==$version"
    sdist=$tmp/download/llama_cpp_python-$version.tar.gz
fi
[[ -f $sdist ]] || { echo "build_llama_cpp.sh: no such file: $sdist" >&2; exit 2; }

echo "==> unpack $sdist"
tar -xzf "$sdist" -C "$tmp"
pkg=$tmp/llama_cpp_python-$version
[[ -f $pkg/vendor/llama.cpp/convert_hf_to_gguf.py ]] || {
    echo "build_llama_cpp.sh: $sdist is not llama_cpp_python-$version with vendor/llama.cpp" >&2
    exit 2
}

# One cmake build: the wheel's libraries plus llama.cpp's tools (CPU, -march=native, no network).
export CMAKE_BUILD_PARALLEL_LEVEL=$jobs
export CFLAGS="${CFLAGS:+$CFLAGS }$extra_flags" CXXFLAGS="${CXXFLAGS:+$CXXFLAGS }$extra_flags"
export CMAKE_ARGS="-DGGML_NATIVE=ON -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON \
-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
-DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF -DLLAVA_BUILD=OFF \
-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache \
-DCMAKE_BUILD_RPATH=\$ORIGIN"
echo "==> build the wheel and the tools (-j $jobs, nice $nice_level, ccache $CCACHE_DIR; log: $tmp/build.log)"
start=$(date +%s)
nice -n "$nice_level" python -m pip wheel -v --no-deps --no-build-isolation \
    --config-settings=build-dir="$tmp/cmake" -w "$tmp/wheel" "$pkg" >"$tmp/build.log" 2>&1 || {
    { grep -A8 "CMake Error" "$tmp/build.log" | head -60; tail -30 "$tmp/build.log"; } >&2
    exit 1
}
echo "==> built in $(( $(date +%s) - start ))s; $(ccache -s 2>/dev/null | grep -i 'hits' | head -1 || true)"

mkdir -p "$tmp/bin" "$tmp/src"
for exe in llama-quantize llama-tokenize llama-server llama-bench; do
    path=$(find "$tmp/cmake" -type f -name "$exe" -perm -u+x | head -1)
    [[ -n $path ]] || { echo "build_llama_cpp.sh: $exe was not built" >&2; exit 1; }
    cp "$path" "$tmp/bin/$exe"
done
find "$tmp/cmake" -name 'lib*.so*' \( -type f -o -type l \) -exec cp -P {} "$tmp/bin/" \;
# The converter: convert_hf_to_gguf.py, the conversion package it imports, gguf-py.
for item in convert_hf_to_gguf.py conversion gguf-py; do
    [[ -e $pkg/vendor/llama.cpp/$item ]] || { echo "build_llama_cpp.sh: no vendor/llama.cpp/$item in $sdist" >&2; exit 1; }
    mv "$pkg/vendor/llama.cpp/$item" "$tmp/src/"
done
for exe in llama-quantize llama-tokenize llama-bench; do
    "$tmp/bin/$exe" --help >/dev/null 2>&1 || [[ $? -le 1 ]] || { echo "build_llama_cpp.sh: $exe does not run" >&2; exit 1; }
done
rm -rf "$pkg" "$tmp/cmake" "$tmp/download"
mv "$tmp/build.log" "$tmp/build-log.txt"
printf '%s\nbuilt %s\n' "$stamp" "$(date -u +%FT%TZ)" >"$tmp/COMPLETE"

# Atomic: the cache appears whole or not at all (a concurrent build that won the race is kept). A
# cache with another stamp is moved aside first, then removed.
if [[ -e $cache ]] && ! grep -qxF "$stamp" "$cache/COMPLETE" 2>/dev/null; then
    mv -T "$cache" "$tmp.stale" && rm -rf "$tmp.stale"
fi
if ! mv -T "$tmp" "$cache" 2>/dev/null; then
    [[ -f $cache/COMPLETE ]] || { echo "build_llama_cpp.sh: cannot move $tmp to $cache" >&2; exit 1; }
fi
trap - EXIT
echo "==> llama.cpp $version: $cache ($(ls "$cache/bin" | grep -c '^llama-') tools, wheel $(ls "$cache/wheel"))"
install_wheel
