"""Where the tests find llama.cpp's tools and sources (built by ``scripts/build_llama_cpp.sh``).

One lookup for every test that compares with llama.cpp, so a missing tool is a clean skip whose
reason starts with :data:`SKIP_REASON` (``scripts/test.sh`` counts those skips and prints the
count, so a comparison that did not run is visible). The order of the lookup:

* ``KAEL_LLAMA_CPP_BIN`` (a folder holding ``llama-tokenize`` etc.) and ``KAEL_LLAMA_CPP_DIR``
  (a llama.cpp source tree holding ``convert_hf_to_gguf.py`` and ``gguf-py``), when set;
* the build cache ``${KAEL_LLAMA_CPP_CACHE:-~/.cache/kael/llama.cpp-0.3.36}``, used only when
  the build finished (its ``COMPLETE`` file exists);
* the tool on ``PATH``.
"""

from __future__ import annotations

import ctypes
import os
import shutil
from pathlib import Path

import pytest

__all__ = [
    "LLAMA_CPP_VERSION",
    "SKIP_REASON",
    "cache_dir",
    "find_tool",
    "ggml_library",
    "require_source",
    "require_tool",
    "source_dir",
]

#: The llama-cpp-python release whose vendored llama.cpp the cache is built from.
LLAMA_CPP_VERSION = "0.3.36"
#: How every llama.cpp skip reason starts (scripts/test.sh counts the skips by it).
SKIP_REASON = "llama.cpp not built"


def cache_dir() -> Path | None:
    """The build cache of scripts/build_llama_cpp.sh when it is complete, else ``None``."""
    default = Path.home() / ".cache" / "kael" / f"llama.cpp-{LLAMA_CPP_VERSION}"
    path = Path(os.environ.get("KAEL_LLAMA_CPP_CACHE") or default)
    return path if (path / "COMPLETE").is_file() else None


def find_tool(name: str) -> str | None:
    """The path of llama.cpp's executable ``name`` (e.g. ``"llama-tokenize"``), or ``None``."""
    folders = [os.environ.get("KAEL_LLAMA_CPP_BIN")]
    cache = cache_dir()
    if cache is not None:
        folders.append(str(cache / "bin"))
    for folder in folders:
        if folder and os.access(Path(folder) / name, os.X_OK):
            return str(Path(folder) / name)
    return shutil.which(name)


def require_tool(name: str) -> str:
    """:func:`find_tool`, skipping the calling test when the tool is not there."""
    path = find_tool(name)
    if path is None:
        pytest.skip(f"{SKIP_REASON}: no {name} (run scripts/build_llama_cpp.sh or set KAEL_LLAMA_CPP_BIN)")
    return path


def source_dir() -> Path | None:
    """A llama.cpp source tree with ``convert_hf_to_gguf.py`` and ``gguf-py``, or ``None``."""
    cache = cache_dir()
    for folder in (os.environ.get("KAEL_LLAMA_CPP_DIR"), cache / "src" if cache is not None else None):
        if folder and (Path(folder) / "convert_hf_to_gguf.py").is_file():
            return Path(folder)
    return None


def require_source() -> Path:
    """:func:`source_dir`, skipping the calling test when there is none."""
    path = source_dir()
    if path is None:
        pytest.skip(
            f"{SKIP_REASON}: no convert_hf_to_gguf.py (run scripts/build_llama_cpp.sh or set KAEL_LLAMA_CPP_DIR)"
        )
    return path


def ggml_library(name: str) -> ctypes.CDLL:
    """One of the ggml libraries llama-cpp-python ships (``libggml-base.so``, ``libggml-cpu.so``), loaded with
    ctypes; skips the calling test when llama_cpp or the library is absent."""
    llama_cpp = pytest.importorskip("llama_cpp", reason=SKIP_REASON + ": no llama_cpp package (llama-cpp-python)")
    path = os.path.join(os.path.dirname(llama_cpp.__file__), "lib", name)
    if not os.path.exists(path):
        pytest.skip(f"{SKIP_REASON}: llama_cpp has no {path}")
    return ctypes.CDLL(path)
