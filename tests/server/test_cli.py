"""The ``kael-server`` command, the package metadata and the kael plugin entry point."""

from __future__ import annotations

import importlib
import pkgutil
import platform
import shutil
import socket
import subprocess
import sys
from importlib import metadata
from importlib.metadata import entry_points
from pathlib import Path

import pytest
from kael_server.cli import build_parser
from kael_server.loading import ServerConfigError, checkpoint_dir

import kael_server


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kael_server.cli", *args], capture_output=True, text=True, timeout=60)


def test_defaults_match_the_issue() -> None:
    args = build_parser().parse_args([])
    assert (args.data, args.device, args.host, args.port, args.log_format) == (
        None,
        "cpu",
        "127.0.0.1",
        8000,
        "console",
    )


def test_help_describes_every_flag() -> None:
    result = run_cli("--help")
    assert result.returncode == 0
    for flag in ("--data", "--device", "--host", "--port", "--log-format", "--log-level"):
        assert flag in result.stdout
    assert "127.0.0.1" in result.stdout and "8000" in result.stdout


def test_console_script_is_installed() -> None:
    script = shutil.which("kael-server")
    if script is None:
        pytest.skip("kael-server is not on PATH (package not installed with its scripts)")
    assert subprocess.run([script, "--help"], capture_output=True, timeout=60).returncode == 0


def test_bad_data_directory_is_a_clear_error(tmp_path: Path) -> None:
    result = run_cli("--data", str(tmp_path / "nowhere"))
    assert result.returncode == 2
    assert "is not a directory" in result.stderr
    (tmp_path / "config.json").write_text("{}")
    result = run_cli("--data", str(tmp_path))
    assert result.returncode == 2
    assert "lacks model.safetensors, a tokenizer (tokenizer.json, or vocab.json and merges.txt)" in result.stderr
    (tmp_path / "vocab.json").write_text("{}")
    result = run_cli("--data", str(tmp_path))
    assert result.returncode == 2
    assert "lacks model.safetensors, merges.txt" in result.stderr


def test_no_data_means_the_bundled_model_or_a_clear_error() -> None:
    bundled = Path(kael_server.__file__).parent / "models" / "kael-tiny"
    if (bundled / "config.json").is_file():
        assert checkpoint_dir(None) == bundled
    else:
        with pytest.raises(ServerConfigError, match="--data DIR"):
            checkpoint_dir(None)


def test_registered_as_kael_plugin_named_server() -> None:
    (plugin,) = [ep for ep in entry_points(group="kael.plugins") if ep.name == "server"]
    assert plugin.value == "kael_server.plugin"
    assert plugin.load() is importlib.import_module("kael_server.plugin")


def test_the_kael_plugin_entry_point_does_not_import_the_web_stack() -> None:
    # kael loads `kael_server.plugin` with every plugin load (the first backward pass, for
    # one): that must not import Litestar, uvicorn and structlog; the public names still work.
    code = (
        "import sys, kael_server.plugin\n"
        "heavy = [m for m in ('litestar', 'uvicorn', 'structlog') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
        "import kael_server\n"
        "assert set(kael_server.__all__) <= set(dir(kael_server)), dir(kael_server)\n"
        "assert kael_server.create_app.__module__ == 'kael_server.app'\n"
        "assert 'litestar' in sys.modules\n"
        "try:\n"
        "    kael_server.nope\n"
        "except AttributeError as e:\n"
        "    assert 'nope' in str(e)\n"
        "else:\n"
        "    raise SystemExit('no AttributeError')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def refusal_line(result: subprocess.CompletedProcess[str]) -> str:
    """The one line a refused start prints (kael may also warn about a plugin, as a log line)."""
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    # Refused before listening: uvicorn never started.
    assert "Application startup" not in result.stderr and "listening" not in result.stderr
    (line,) = [x for x in result.stderr.splitlines() if x.startswith("kael-server:")]
    return line


def test_version() -> None:
    result = run_cli("--version")
    assert result.returncode == 0
    assert (
        result.stdout.strip()
        == f"kael-server {kael_server.__version__} (kael-core {metadata.version('kael-core')}, Python {platform.python_version()})"
    )


@pytest.mark.parametrize("port", ["0", "-1", "65536", "70000"])
def test_port_out_of_range_is_refused_in_one_line(port: str) -> None:
    line = refusal_line(run_cli("--port", port))
    assert line == f"kael-server: --port must be a TCP port from 1 to 65535, got {port}"


def test_port_in_use_is_refused_in_one_line() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        line = refusal_line(run_cli("--port", str(port)))
    assert line.startswith(f"kael-server: cannot listen on 127.0.0.1:{port}: ") and "in use" in line


@pytest.mark.parametrize("device", ["banana", "cpu:x", ""])
def test_nonsense_device_is_refused_in_one_line(device: str) -> None:
    pytest.importorskip("kael")
    line = refusal_line(run_cli("--device", device))
    assert line.startswith(f"kael-server: --device {device!r} cannot be used: ")


def test_cuda_without_a_gpu_is_refused_in_one_line() -> None:
    kael = pytest.importorskip("kael")
    if kael.cuda.is_available():
        pytest.skip("this machine has a usable cuda device")
    line = refusal_line(run_cli("--device", "cuda"))
    assert line.startswith("kael-server: --device 'cuda' cannot be used: ")
    assert kael.cuda.unavailable_reason() in line


def test_every_module_declares_its_public_names() -> None:
    modules = [m.name for m in pkgutil.walk_packages(kael_server.__path__, "kael_server.")]
    assert {"kael_server.auth", "kael_server.deadline", "kael_server.routes.status"} <= set(modules)
    for name in ["kael_server", *modules]:
        module = importlib.import_module(name)
        assert isinstance(getattr(module, "__all__", None), list), f"{name} has no __all__"
        missing = [n for n in module.__all__ if not hasattr(module, n)]
        assert not missing, f"{name}.__all__ names what it lacks: {missing}"
