"""The fuzz targets as regression tests: every seed and every saved finding must pass.

Each Python target's `TestOneInput` runs (uninstrumented, without atheris) over its seed
corpus fuzz/corpus/<target>/ and over fuzz/regressions/<target>/, where each input that
once found a bug is kept after the fix. fuzz_kernels runs the same way against the
installed C++ backend (without sanitizers) when kael has a backend named "cpu". A target
raises on any unexpected outcome, so a bug that comes back fails here. One more test runs
`fuzz/run.py` for a few seconds to show that the runner works and leaves the committed
corpus alone.
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
FUZZ = ROOT / "fuzz"
PY_TARGETS = [
    "fuzz_safetensors",
    "fuzz_gguf",
    "fuzz_checkpoint_index",
    "fuzz_idx",
    "fuzz_tokenizer",
    "fuzz_hf_tokenizer",
    "fuzz_generate_request",
]
TARGETS = [*PY_TARGETS, "fuzz_kernels"]


def _inputs() -> list[tuple[str, Path]]:
    cases = []
    for target in TARGETS:
        for folder in (FUZZ / "corpus" / target, FUZZ / "regressions" / target):
            if folder.is_dir():
                cases += [(target, p) for p in sorted(folder.iterdir()) if p.is_file()]
    return cases


def _load(target: str) -> ModuleType:
    if str(FUZZ) not in sys.path:
        sys.path.insert(0, str(FUZZ))
    if target == "fuzz_generate_request":
        pytest.importorskip("kael_server")
    if target == "fuzz_kernels":
        import kael

        if "cpu" not in {b.name for b in kael.backends.available()}:
            pytest.skip("the C++ backend (kael-backend-cpu) is not installed")
    return importlib.import_module(target)


CASES = _inputs()


def test_every_target_has_seeds() -> None:
    assert {t for t, _ in CASES} == set(TARGETS)


@pytest.mark.parametrize(("target", "path"), CASES, ids=[f"{t}/{p.parent.parent.name}/{p.name}" for t, p in CASES])
def test_input_passes(target: str, path: Path) -> None:
    _load(target).TestOneInput(path.read_bytes())


def test_runner_fuzzes_briefly_without_touching_the_corpus() -> None:
    pytest.importorskip("atheris")
    corpus = FUZZ / "corpus" / "fuzz_idx"
    before = sorted((p.name, p.read_bytes()) for p in corpus.iterdir())
    proc = subprocess.run(
        [sys.executable, str(FUZZ / "run.py"), "fuzz_idx", "--seconds", "5"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["target"] == "fuzz_idx"
    assert summary["findings"] == []
    assert summary["executions"] > len(before)  # it ran the seeds, then fuzzed
    assert summary["exec_per_sec"] > 0
    assert sorted((p.name, p.read_bytes()) for p in corpus.iterdir()) == before
