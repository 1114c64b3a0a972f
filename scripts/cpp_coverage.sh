#!/usr/bin/env bash
# Line coverage of kael_backend_cpu's C++ sources (gcov, summarised by gcovr).
#
#   bash scripts/cpp_coverage.sh            C++ tests, then the Python conformance kit on the same build
#   bash scripts/cpp_coverage.sh --cpp-only the C++ tests only
#
# Builds kael_backend_cpu with --coverage into build/coverage/ (gcc), runs its GoogleTest
# suite with ctest and, unless --cpp-only, the conformance kit against the instrumented
# extension (most kernel lines are reached from Python), then prints gcovr's per-file line
# table and total for kael_backend_cpu/csrc/ (in full, with the uncovered lines, in
# build/coverage/coverage.txt; for CI tools, build/coverage/coverage.xml in Cobertura format).
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
ctest --test-dir "$BUILD" --output-on-failure --timeout 600 -j "$JOBS"
if ((!cpp_only)); then
    echo "==> coverage: Python conformance kit on the instrumented extension ($JOBS pytest-xdist workers; gcov merges their counts)"
    cpu_python "$BUILD" -m pytest --pyargs kael.testing.conformance --kael-backend cpu -q -p no:cacheprovider -n "$JOBS"
fi
echo "==> coverage: kael_backend_cpu/csrc line coverage"
# CMake's compiler checks were built with --coverage too: their notes are not ours
find "$BUILD/CMakeFiles" -path '*CompilerId*' \( -name '*.gcno' -o -name '*.gcda' \) -delete
merge=()  # one count per source line, not per template instantiation (gcovr >= 8)
gcovr --help | grep -q -- --merge-lines && merge=(--merge-lines)
gcovr --root . --filter 'kael_backend_cpu/csrc/' --object-directory "$BUILD" --gcov-executable "${GCOV:-gcov}" \
    "${merge[@]}" --txt "$BUILD/coverage.txt" --cobertura "$BUILD/coverage.xml"
# The table without its column of uncovered line numbers (in build/coverage/coverage.txt).
awk '{ if (NF >= 4 && $4 ~ /%$/) printf "%-44s %8s %8s %6s\n", $1, $2, $3, $4; else if ($0 !~ /^File|^Missing/) print }' \
    "$BUILD/coverage.txt"
