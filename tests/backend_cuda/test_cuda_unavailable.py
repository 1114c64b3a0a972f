"""Without a GPU: kael imports, the backend says why it is unavailable, and cuda tensors raise DeviceError.

Two machines without a GPU are simulated with stand-in ``cupy`` modules, so the tests
do not depend on what is installed here: one where CuPy cannot be imported, one where
it imports but the CUDA runtime finds no driver. ``python -m kael info`` is run in a
subprocess with and without emulation; so is the conformance kit under emulation.
"""

from __future__ import annotations

import subprocess
import sys
import types
from pathlib import Path

import kael
import pytest

ROOT = Path(__file__).resolve().parents[2]
NO_DRIVER = "cudaErrorInsufficientDriver: CUDA driver version is insufficient for CUDA runtime version"

FAKE_CUPY = {
    "missing": "raise ImportError('simulated: libcudart.so.12 not found')\n",
    "no_driver": (
        "class _Runtime:\n"
        "    @staticmethod\n"
        "    def getDeviceCount():\n"
        f"        raise RuntimeError({NO_DRIVER!r})\n"
        "class cuda:\n"
        "    runtime = _Runtime\n"
    ),
}


def _fake_cupy_module(kind: str) -> types.ModuleType | None:
    if kind == "missing":
        return None  # sys.modules["cupy"] = None makes `import cupy` raise ImportError
    mod = types.ModuleType("cupy")
    exec(FAKE_CUPY[kind], mod.__dict__)
    return mod


@pytest.mark.parametrize("kind, reason", [("missing", "CuPy is not importable"), ("no_driver", NO_DRIVER)])
def test_device_error_says_why(no_emulation, monkeypatch, kind, reason):
    from kael._plugins import manager

    from kael_backend_cuda import _xp

    monkeypatch.setitem(sys.modules, "cupy", _fake_cupy_module(kind))
    _xp.reset()
    manager.invalidate()
    ok, why = no_emulation.is_available()
    assert not ok and reason in why
    with pytest.raises(kael.DeviceError, match=r"backend 'cuda' is unavailable: .*" + reason[:20]):
        kael.tensor([1.0], device="cuda")
    with pytest.raises(kael.DeviceError):
        kael.zeros(2).to("cuda")
    assert not kael.cuda.is_available()
    assert reason in kael.cuda.unavailable_reason()
    assert kael.cuda.device_count() == 0
    with pytest.raises(kael.DeviceError, match="not available"):
        kael.cuda.synchronize()
    assert kael.ones(2).sum().item() == 2.0  # cpu is unaffected


def test_emulation_with_a_bad_device_count_is_unavailable(monkeypatch):
    from kael_backend_cuda import _xp

    monkeypatch.setenv("KAEL_CUDA_EMULATE", "1")
    monkeypatch.setenv("KAEL_CUDA_EMULATE_DEVICES", "zero")
    _xp.reset()
    try:
        s = _xp.state()
        assert not s.available and "KAEL_CUDA_EMULATE_DEVICES" in s.reason
    finally:
        _xp.reset()


def _run(
    args: list[str],
    env: dict[str, str],
    tmp_path: Path,
    kind: str | None = None,
    emulate: bool = False,
    timeout: int = 120,
) -> subprocess.CompletedProcess[str]:
    env = dict(env)
    if kind is not None:
        fake = tmp_path / kind / "cupy"
        fake.mkdir(parents=True)
        (fake / "__init__.py").write_text(FAKE_CUPY[kind])
        env["PYTHONPATH"] = str(tmp_path / kind) + ":" + env["PYTHONPATH"]
    if emulate:
        env["KAEL_CUDA_EMULATE"] = "1"
    return subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=timeout, cwd=ROOT)


@pytest.mark.parametrize("kind, reason", [("missing", "CuPy is not importable"), ("no_driver", NO_DRIVER)])
def test_kael_info_without_a_gpu(subprocess_env, tmp_path, kind, reason):
    r = _run(["-m", "kael", "info"], subprocess_env, tmp_path, kind)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    plugin = next(line for line in lines if "kael.backends" in line and " cuda " in line)
    assert "loaded" in plugin  # installed, and loading it did not fail
    backend = next(line for line in lines if line.strip().startswith("cuda ") and "device=cuda" in line)
    assert "unavailable (" in backend and reason in backend
    device = next(line for line in lines if line.strip().startswith("cuda ") and "device=" not in line)
    assert "not usable" in device and reason in device


def test_kael_info_with_emulation(subprocess_env, tmp_path):
    r = _run(["-m", "kael", "info"], subprocess_env, tmp_path, "missing", emulate=True)  # CuPy not needed
    assert r.returncode == 0, r.stderr
    backend = next(line for line in r.stdout.splitlines() if "device=cuda" in line)
    assert backend.rstrip().endswith("available") and "unavailable" not in backend
    assert "served by 'cuda' (1 device)" in r.stdout


def test_conformance_kit_passes_under_emulation(subprocess_env, tmp_path):
    r = _run(
        [
            "-m",
            "pytest",
            "--pyargs",
            "kael.testing.conformance",
            "--kael-backend",
            "cuda",
            "-q",
            "-x",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:randomly",
        ],
        subprocess_env,
        tmp_path,
        "missing",
        emulate=True,
        timeout=600,
    )
    tail = "\n".join(r.stdout.splitlines()[-15:])
    assert r.returncode == 0, tail + r.stderr[-2000:]
    assert " passed" in tail and "failed" not in tail


def test_kael_cuda_without_the_package(subprocess_env, tmp_path):
    code = (
        "import kael\n"
        "assert not kael.cuda.is_available() and kael.cuda.device_count() == 0\n"
        "print(kael.cuda.unavailable_reason())\n"
        "try:\n"
        "    kael.zeros(1, device='cuda')\n"
        "except kael.DeviceError as exc:\n"
        "    print('DeviceError:', exc)\n"
    )
    env = dict(subprocess_env, KAEL_DISABLE_PLUGIN_AUTOLOAD="1")  # as if kael-backend-cuda were not installed
    r = _run(["-c", code], env, tmp_path)
    assert r.returncode == 0, r.stderr
    assert "install kael-backend-cuda" in r.stdout
    assert "DeviceError: no backend serves device type 'cuda'" in r.stdout
