#!/usr/bin/env bash
# Install everything kael needs on a fresh clone, then run the whole test suite.
#
#   ./scripts/test.sh [PYTEST_ARGS...]
#
# System packages (GoogleTest, clang tools, Chromium for the playground's browser test) are
# installed with apt-get when this runs as root and they are missing; Python packages come
# from requirements-dev.txt. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1

apt_packages=(libgtest-dev clang clang-format clang-tidy chromium)
missing=()
for pkg in "${apt_packages[@]}"; do
    dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
if ((${#missing[@]})) && [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
    echo "==> apt-get install ${missing[*]}"
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

echo "==> pip install -r requirements-dev.txt"
python -m pip install -q -r requirements-dev.txt
python -m pip install -q --no-deps -e ./kael_backend_cuda

echo "==> pytest"
python -m pytest "$@"
