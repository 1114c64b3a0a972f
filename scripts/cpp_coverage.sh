#!/usr/bin/env bash
# Line coverage of kael_backend_cpu's C++ sources (gcov, summarised by gcovr).
#
#   bash scripts/cpp_coverage.sh            C++ tests, then the Python conformance kit on the same build
#   bash scripts/cpp_coverage.sh --cpp-only the C++ tests only
#
# Builds kael_backend_cpu with --coverage into build/coverage/ (gcc), runs its GoogleTest
# suite with ctest and, unless --cpp-only, the conformance kit against the instrumented
# extension (most kernel lines are reached from Python), then prints gcovr's per-file line
# table and total for kael_backend_cpu/csrc/ (also written to build/coverage/coverage.txt
# and, for CI tools, build/coverage/coverage.xml in Cobertura format).
# Needs: gcc/g++, gcov, gcovr (pip install gcovr, or the Debian package).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/_cpu_build.sh
source scripts/_cpu_build.sh

command -v gcovr >/dev/null 2>&1 || { echo "cpp_coverage.sh: gcovr is not installed (pip install gcovr)" >&2; exit 1; }
export CC=${CC:-gcc} CXX=${CXX:-g++}
BUILD=build/coverage
cpp_only=0
[[ ${1:-} == --cpp-only ]] && cpp_only=1

find "$BUILD" -name '*.gcda' -delete 2>/dev/null || true
cpu_build "$BUILD" -DCMAKE_CXX_FLAGS="--coverage -fprofile-update=atomic" \
    -DCMAKE_EXE_LINKER_FLAGS=--coverage -DCMAKE_SHARED_LINKER_FLAGS=--coverage -DCMAKE_MODULE_LINKER_FLAGS=--coverage
echo "==> coverage: C++ tests"
ctest --test-dir "$BUILD" --output-on-failure -j "$JOBS"
if ((!cpp_only)); then
    echo "==> coverage: Python conformance kit on the instrumented extension"
    cpu_python "$BUILD" -m pytest --pyargs kael.testing.conformance --kael-backend cpu -q -p no:cacheprovider
fi
echo "==> coverage: kael_backend_cpu/csrc line coverage"
gcovr --root . --filter 'kael_backend_cpu/csrc/' --object-directory "$BUILD" --gcov-executable "${GCOV:-gcov}" \
    --txt "$BUILD/coverage.txt" --cobertura "$BUILD/coverage.xml" --print-summary
cat "$BUILD/coverage.txt"
