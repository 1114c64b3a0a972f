"""The one way to run a fuzz target: `python fuzz/run.py TARGET --seconds N`.

    python fuzz/run.py fuzz_safetensors --seconds 60      # fuzz for a minute
    python fuzz/run.py fuzz_idx --runs 1000               # a fixed number of executions
    python fuzz/run.py fuzz_tokenizer --seconds 600 --update-corpus

The runner gives libFuzzer a 2 GiB memory limit (RSS and single allocations), works on a
temporary copy of the committed corpus (new inputs are copied back only with
`--update-corpus`), saves any finding (crash-*, oom-*, timeout-*, leak-*) under
fuzz/findings/TARGET/, exits non-zero on a finding, and prints one line of JSON:
`{"target", "seconds", "executions", "exec_per_sec", "new_inputs", "findings", "exit_code"}`.

Python targets (fuzz/TARGET.py) run under atheris. The native target fuzz_kernels needs
the C++ backend built with sanitizers and libFuzzer instrumentation first: run.py builds
it (fuzz/build_kernels.sh) unless it is up to date, and preloads atheris's ASan runtime.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
TARGETS = (
    "fuzz_safetensors",
    "fuzz_gguf",
    "fuzz_checkpoint_index",
    "fuzz_idx",
    "fuzz_tokenizer",
    "fuzz_hf_tokenizer",
    "fuzz_generate_request",
    "fuzz_kernels",
)
NATIVE = {"fuzz_kernels"}
MEMORY_MB = 2048
FINDING_PREFIXES = ("crash-", "oom-", "timeout-", "leak-", "slow-unit-")
# Package sources first on the path: targets work from a checkout without installing.
SOURCES = ["kael_core/src", "kael_server/src", "kael_debug/src", "kael_backend_cpu/src"]


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("target", choices=TARGETS)
    p.add_argument("--seconds", type=int, default=60, help="stop after this many seconds (default 60)")
    p.add_argument("--runs", type=int, default=None, help="stop after this many executions")
    p.add_argument("--update-corpus", action="store_true", help="copy new inputs into fuzz/corpus/TARGET/")
    p.add_argument("--timeout", type=int, default=60, help="seconds one input may take before it is a finding")
    p.add_argument("--max-len", type=int, default=None, help="longest input libFuzzer generates")
    p.add_argument("extra", nargs="*", help="further libFuzzer flags, after --")
    return p.parse_args(argv)


def _environment(target: str) -> dict[str, str]:
    env = dict(os.environ)
    paths = [str(ROOT / s) for s in SOURCES if (ROOT / s).is_dir()]
    env["PYTHONPATH"] = os.pathsep.join([*paths, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    if target in NATIVE:
        env.update(_native_environment())
    return env


def _native_environment() -> dict[str, str]:
    """Build the instrumented extension if needed; preload atheris's ASan+libFuzzer runtime.

    KAEL_CPU_EXTENSION makes the installed kael_backend_cpu load the instrumented build.
    """
    subprocess.run(["bash", str(HERE / "build_kernels.sh")], check=True, cwd=ROOT)
    import atheris  # only the native target needs it here

    return {
        # libstdc++ as well: Python has none when ASan starts, and ASan's __cxa_throw
        # interceptor then aborts at the first C++ exception (a KaelError thrown in C++)
        "LD_PRELOAD": f"{Path(atheris.path()) / 'asan_with_fuzzer.so'} libstdc++.so.6",
        "PYTHONMALLOC": "malloc",
        "KAEL_CPU_EXTENSION": (ROOT / "build" / "fuzz-kernels" / "extension").read_text().strip(),
        "ASAN_OPTIONS": "detect_leaks=0:allocator_may_return_null=1",
        "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1",
    }


def _command(args: argparse.Namespace, work: Path, findings: Path) -> list[str]:
    cmd = [sys.executable, str(HERE / f"{args.target}.py"), str(work)]
    cmd += [
        f"-rss_limit_mb={MEMORY_MB}",
        f"-malloc_limit_mb={MEMORY_MB}",
        f"-timeout={args.timeout}",
        f"-artifact_prefix={findings}/",
        "-print_final_stats=1",
    ]
    if args.seconds:
        cmd.append(f"-max_total_time={args.seconds}")
    if args.runs is not None:
        cmd.append(f"-runs={args.runs}")
    dictionary = HERE / "dicts" / f"{args.target}.dict"
    if dictionary.is_file():
        cmd.append(f"-dict={dictionary}")
    if args.max_len is not None:
        cmd.append(f"-max_len={args.max_len}")
    return cmd + args.extra


def _stat(log: str, name: str) -> int | None:
    found = re.findall(rf"stat::{name}:\s*(\d+)", log)
    return int(found[-1]) if found else None


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    corpus = HERE / "corpus" / args.target
    findings = HERE / "findings" / args.target
    findings.mkdir(parents=True, exist_ok=True)
    before = {p.name for p in findings.iterdir()}
    with tempfile.TemporaryDirectory(prefix=f"kael-{args.target}-") as tmp:
        work = Path(tmp) / "corpus"
        shutil.copytree(corpus, work) if corpus.is_dir() else work.mkdir()
        seeds = {p.name for p in work.iterdir()}
        started = time.monotonic()
        proc = subprocess.run(
            _command(args, work, findings),
            env=_environment(args.target),
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
        )
        elapsed = time.monotonic() - started
        new = sorted(p for p in work.iterdir() if p.name not in seeds)
        if args.update_corpus:
            corpus.mkdir(parents=True, exist_ok=True)
            for p in new:
                shutil.copy2(p, corpus / p.name)
    sys.stderr.write(proc.stdout)
    found = sorted(
        str((findings / name).relative_to(ROOT))
        for name in {p.name for p in findings.iterdir()} - before
        if name.startswith(FINDING_PREFIXES)
    )
    executions = _stat(proc.stdout, "number_of_executed_units")
    rate = _stat(proc.stdout, "average_exec_per_sec")
    summary = {
        "target": args.target,
        "seconds": round(elapsed, 1),
        "executions": executions,
        "exec_per_sec": rate,
        "new_inputs": len(new),
        "corpus_updated": bool(args.update_corpus and new),
        "findings": found,
        "exit_code": proc.returncode,
    }
    print(json.dumps(summary))
    return 0 if proc.returncode == 0 and not found else 1


if __name__ == "__main__":
    sys.exit(main())
