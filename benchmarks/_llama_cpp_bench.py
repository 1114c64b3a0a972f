"""llama.cpp as its users run it, for the benchmarks: the ``llama-bench`` and ``llama-quantize`` binaries.

The binaries come from ``scripts/build_llama_cpp.sh`` (found as the tests find them:
``tests/llama_cpp_tools.py``: ``KAEL_LLAMA_CPP_BIN``, the build cache, then ``PATH``). Never
through a Python per-token loop.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

__all__ = ["find_tool", "llama_bench", "llama_quantize"]


def find_tool(name: str) -> str | None:
    """The path of llama.cpp's executable ``name``, or None (tests/llama_cpp_tools.py's lookup)."""
    sys.path.insert(0, str(ROOT / "tests"))
    try:
        from llama_cpp_tools import find_tool as find
    finally:
        sys.path.pop(0)
    path: str | None = find(name)
    return path


def llama_quantize(src: Path, out: Path, ftype: str, threads: int) -> None:
    """``llama-quantize SRC OUT FTYPE THREADS`` (llama.cpp's mixes, no importance matrix)."""
    tool = find_tool("llama-quantize")
    if tool is None:
        raise SystemExit("llama-quantize not found: run scripts/build_llama_cpp.sh --install")
    r = subprocess.run([tool, str(src), str(out), ftype.upper(), str(threads)], capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"llama-quantize {src.name} -> {ftype} failed:\n{r.stderr[-2000:]}")


_PEAK_RSS = (
    "import resource, subprocess, sys; r = subprocess.run(sys.argv[1:]); "
    "sys.stderr.write('\\nmaxrss_kib %d\\n' % resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); "
    "sys.exit(r.returncode)"
)


def llama_bench(path: Path, threads: int, prompt: int, tokens: int, repeats: int) -> dict[str, Any]:
    """``llama-bench -m PATH -p PROMPT -n TOKENS -t THREADS -r REPEATS -o json``: pp and tg tok/s (mean and
    standard deviation over the repetitions), its peak resident memory (``peak_rss_mb``) and the build and CPU it
    reports; ``error`` when it fails."""
    tool = find_tool("llama-bench")
    if tool is None:
        return {"engine": "llama-bench", "threads": threads, "error": "llama-bench not found"}
    cmd = [tool, "-m", str(path), "-p", str(prompt), "-n", str(tokens), "-t", str(threads), "-r", str(repeats)]
    # Run through a Python parent whose only child is llama-bench, so RUSAGE_CHILDREN's ru_maxrss is its peak.
    r = subprocess.run(
        [sys.executable, "-c", _PEAK_RSS, *cmd, "-o", "json"], capture_output=True, text=True, check=False
    )
    if r.returncode != 0:
        return {"engine": "llama-bench", "threads": threads, "error": r.stderr.strip()[-2000:]}
    rows = json.loads(r.stdout)
    out: dict[str, Any] = {"engine": "llama-bench", "threads": threads, "command": " ".join(cmd)}
    peak = [line.split()[1] for line in r.stderr.splitlines() if line.startswith("maxrss_kib ")]
    if peak:
        out["peak_rss_mb"] = round(int(peak[-1]) * 1024 / 1e6, 1)
    for row in rows:
        kind = "prefill" if row.get("n_prompt", 0) > 0 and row.get("n_gen", 0) == 0 else "decode"
        out[f"{kind}_tok_s"] = float(row["avg_ts"])
        out[f"{kind}_tok_s_stdev"] = float(row.get("stddev_ts", 0.0))
    first = rows[0] if rows else {}
    out["build"] = {k: first.get(k) for k in ("build_commit", "build_number", "cpu_info", "backends", "type_k")}
    return out
