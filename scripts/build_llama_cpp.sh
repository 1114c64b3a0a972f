#!/usr/bin/env bash
# Build llama.cpp's llama-bench and llama-server for this CPU (-DGGML_NATIVE=ON, static, no
# network at build time) from the llama.cpp vendored in the llama-cpp-python sdist, the one
# matching the installed llama_cpp package, so both measure the same llama.cpp:
#
#   build/llama.cpp/src    the source tree (benchmarks/quantized.py --converter llama.cpp finds
#                          convert_hf_to_gguf.py here)
#   build/llama.cpp/bin    llama-bench, llama-server (benchmarks/server.py --llama-server uses it)
#
# Usage: scripts/build_llama_cpp.sh [SDIST.tar.gz]
#   SDIST   a llama_cpp_python-*.tar.gz already downloaded; default: pip download of the
#           installed version (only that package from source, no build isolation)
#   JOBS=N  parallel compile jobs (default: the number of CPUs); NICE=N (default 10) is the
#           niceness of the build, so a shared machine's other work keeps its share
set -euo pipefail
cd "$(dirname "$0")/.."
out=build/llama.cpp
jobs=${JOBS:-$(nproc)}
nice_level=${NICE:-10}

sdist=${1:-}
if [[ -z $sdist ]]; then
    version=$(python -c "import llama_cpp; print(llama_cpp.__version__)" 2>/dev/null) || {
        echo "build_llama_cpp.sh: llama_cpp is not importable; pass the sdist (llama_cpp_python-X.tar.gz)" >&2
        exit 2
    }
    mkdir -p "$out/sdist"
    echo "==> pip download llama-cpp-python==$version (sdist)"
    python -m pip download -q --no-deps --no-binary llama-cpp-python --no-build-isolation \
        -d "$out/sdist" "llama-cpp-python==$version"
    sdist=$(ls "$out"/sdist/llama_cpp_python-"$version".tar.gz)
fi
[[ -f $sdist ]] || { echo "build_llama_cpp.sh: no such file: $sdist" >&2; exit 2; }

echo "==> unpack vendor/llama.cpp of $sdist into $out/src"
rm -rf "$out/src" "$out/unpack"
mkdir -p "$out/unpack"
tar -xzf "$sdist" -C "$out/unpack"
mv "$out"/unpack/llama_cpp_python-*/vendor/llama.cpp "$out/src"
rm -rf "$out/unpack"

echo "==> cmake configure (CPU, GGML_NATIVE=ON, static, no web UI download)"
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
cmake -S "$out/src" -B "$out/cmake" "${generator[@]}" \
    -DCMAKE_BUILD_TYPE=Release \
    -DGGML_NATIVE=ON \
    -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_APP=OFF \
    -DLLAMA_BUILD_SERVER=ON \
    -DLLAMA_BUILD_UI=OFF \
    -DLLAMA_USE_PREBUILT_UI=OFF \
    -DLLAMA_OPENSSL=OFF \
    -DLLAMA_CURL=OFF >"$out/configure.log" 2>&1 || { tail -40 "$out/configure.log" >&2; exit 1; }

echo "==> build llama-bench llama-server (-j $jobs, nice $nice_level; log: $out/build.log)"
nice -n "$nice_level" cmake --build "$out/cmake" --target llama-bench llama-server -j "$jobs" \
    >"$out/build.log" 2>&1 || { tail -40 "$out/build.log" >&2; exit 1; }

mkdir -p "$out/bin"
for exe in llama-bench llama-server; do
    cp "$(find "$out/cmake" -type f -name "$exe" -perm -u+x | head -1)" "$out/bin/$exe"
done
"$out/bin/llama-bench" --help >/dev/null
echo "==> $out/bin: $(ls "$out/bin" | tr '\n' ' ')"
