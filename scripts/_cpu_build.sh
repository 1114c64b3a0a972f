# Shared by scripts/sanitizers.sh and scripts/cpp_coverage.sh (sourced, not run): configure and
# build kael_backend_cpu with CMake, and run Python against an extension from such a build.
#
# cpu_build DIR [CMAKE OPTION...]    configure + build into DIR (C++ tests on, Ninja)
# cpu_python DIR [PYTHON ARG...]     run Python with the _C extension built in DIR
# cpu_pythonpath DIR                 prepare DIR/python/ and print the PYTHONPATH for `python -S`
#
# cpu_pythonpath makes DIR/python/ a package folder (the sources of kael_backend_cpu plus the
# DIR build of _C, and a dist-info holding the package's entry points) and runs
# `python -S` with DIR/python/, the package sources and site-packages on PYTHONPATH.
# -S keeps site-packages' .pth files out: an editable install of kael_backend_cpu
# (whose import hook comes first on sys.meta_path) would otherwise load the normal
# build. The dist-info found first on the path wins, so the entry point is ours.

PYTHON=${PYTHON:-python}
JOBS=${JOBS:-$(nproc)}

cpu_build() {
    local dir=$1
    shift
    local pybind11_dir
    pybind11_dir=$("$PYTHON" -m pybind11 --cmakedir)
    cmake -S kael_backend_cpu -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKAEL_BUILD_TESTS=ON \
        -DPython_EXECUTABLE="$(command -v "$PYTHON")" -Dpybind11_DIR="$pybind11_dir" "$@"
    cmake --build "$dir" -j "$JOBS"
}

cpu_pythonpath() {
    local dir=$1
    local root=$dir/python
    rm -rf "$root"
    mkdir -p "$root"
    cp -r kael_backend_cpu/src/kael_backend_cpu "$root/"
    find "$root" -name '*.so' -delete
    cp "$dir"/_C*.so "$root/kael_backend_cpu/"
    "$PYTHON" - "$root" <<'EOF'
import pathlib, sys
root = pathlib.Path(sys.argv[1])
try:
    import tomllib
    project = tomllib.loads(pathlib.Path("kael_backend_cpu/pyproject.toml").read_text())["project"]
except ModuleNotFoundError:  # Python 3.10: the entry point as pyproject.toml declares it
    project = {"name": "kael-backend-cpu", "version": "0.1.0",
               "entry-points": {"kael.backends": {"cpu": "kael_backend_cpu.plugin"}}}
info = root / f"{project['name'].replace('-', '_')}-{project['version']}.dist-info"
info.mkdir()
(info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n")
lines = []
for group, points in project.get("entry-points", {}).items():
    lines.append(f"[{group}]")
    lines += [f"{name} = {target}" for name, target in points.items()]
(info / "entry_points.txt").write_text("\n".join(lines) + "\n")
EOF
    local site
    site=$("$PYTHON" -c 'import sysconfig; p = sysconfig.get_paths(); print(p["purelib"] + ":" + p["platlib"])')
    local sources=$PWD/kael_core/src:$PWD/kael_debug/src:$PWD/kael_server/src:$PWD/kael_backend_cuda/src
    echo "$PWD/$root:$sources:$site"
}

cpu_python() {
    local dir=$1
    shift
    local path
    path=$(cpu_pythonpath "$dir")
    PYTHONPATH=$path "$PYTHON" -S "$@"
}
