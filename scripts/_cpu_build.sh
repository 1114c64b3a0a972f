# Shared by scripts/sanitizers.sh, scripts/cpp_coverage.sh and fuzz/build_kernels.sh (sourced,
# not run): configure and build kael_backend_cpu with CMake, and run Python with that build.
#
# cpu_build DIR [CMAKE OPTION...]    configure + build into DIR (Ninja, C++ tests on)
# cpu_extension DIR                  the path of the _C extension module built in DIR
# cpu_python DIR [PYTHON ARG...]     run Python with kael_backend_cpu loading DIR's _C
#
# Every build compiles through ccache when it is installed (CMAKE_CXX_COMPILER_LAUNCHER), so the
# sanitizer, coverage and fuzz builds, run again on the same machine, recompile only what changed,
# whatever folder the clone is in: paths under the clone are hashed relative to it
# (CCACHE_BASEDIR) and the working directory is left out of the hash (CCACHE_NOHASHDIR; these
# builds carry debug info, which ccache otherwise keys on the directory), so a CI clone at a
# new path reuses what an earlier clone compiled.
#
# cpu_python sets KAEL_CPU_EXTENSION (kael_backend_cpu/README.md), which makes the installed
# kael_backend_cpu package load that build of the extension instead of its own.

PYTHON=${PYTHON:-python}
JOBS=${JOBS:-$(nproc)}

cpu_build() {
    local dir=$1
    shift
    local pybind11_dir
    local launcher=()
    if command -v ccache >/dev/null; then
        launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
        export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD} CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-1}
    fi
    pybind11_dir=$("$PYTHON" -m pybind11 --cmakedir)
    cmake -S kael_backend_cpu -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKAEL_BUILD_TESTS=ON \
        -DPython_EXECUTABLE="$(command -v "$PYTHON")" -Dpybind11_DIR="$pybind11_dir" "${launcher[@]}" "$@"
    cmake --build "$dir" -j "$JOBS"
}

cpu_extension() {
    local found=("$1"/_C*.so)
    [[ -f ${found[0]} ]] || { echo "no _C extension in $1" >&2; return 1; }
    echo "$PWD/${found[0]}"
}

cpu_python() {
    local dir=$1
    shift
    local extension
    extension=$(cpu_extension "$dir")
    KAEL_CPU_EXTENSION=$extension "$PYTHON" "$@"
}
