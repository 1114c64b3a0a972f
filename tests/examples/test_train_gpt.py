"""examples/train_gpt.py: a corpus too small for its splits is refused with a clear message,
and with --steps the progress bar counts steps (a tiny model, a few steps)."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "train_gpt.py"
TINY = ["--layers", "1", "--heads", "1", "--dimension", "16", "--context", "16", "--batch-size", "2"]


@pytest.fixture(scope="module")
def train_gpt() -> ModuleType:
    pytest.importorskip("kael")
    pytest.importorskip("tqdm")
    spec = importlib.util.spec_from_file_location("train_gpt", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["train_gpt"] = module
    spec.loader.exec_module(module)
    return module


def test_corpus_problem_names_the_split_and_the_fix(train_gpt: ModuleType) -> None:
    big, small = np.zeros(1000, np.int64), np.zeros(17, np.int64)
    assert train_gpt.corpus_problem(big, big, 16, 1.0) is None
    assert train_gpt.corpus_problem(big, np.zeros(18, np.int64), 16, 1.0) is None  # 18 > 17: one batch row fits
    held = train_gpt.corpus_problem(big, small, 16, 0.5)
    assert held == (
        "the corpus is too small for its held-out split: 17 bytes, but --context 16 needs more than 17 "
        "(the held-out split is about 5% of the files); raise --corpus-mb (now 0.5) or lower --context"
    )
    assert "training split: 0 bytes" in train_gpt.corpus_problem(np.zeros(0, np.int64), big, 16, 0.5)


def test_a_tiny_corpus_is_refused_with_a_clear_message(
    train_gpt: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # One stdlib file at most: one of the two splits is empty or too short for --context 256.
    assert train_gpt.main(["--corpus-mb", "0.000001", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    (line,) = [x for x in err.splitlines() if x.startswith("error:")]
    assert re.fullmatch(r"error: the corpus is too small for its (held-out|training) split: .*--corpus-mb.*", line)
    assert "Traceback" not in err
    assert not (tmp_path / "out").exists()  # refused before anything was written


def test_the_progress_bar_counts_steps(
    train_gpt: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "tiny"
    args = [*TINY, "--steps", "3", "--corpus-mb", "4", "--eval-every", "1000", "--eval-batches", "1"]
    assert train_gpt.main([*args, "--out", str(out)]) == 0
    captured = capsys.readouterr()
    summary = json.loads(captured.out.strip().splitlines()[-1])
    assert summary["steps"] == 3
    bar = captured.err.replace("\r", "\n")
    assert re.search(r"\| 3/3 steps \[", bar), bar  # steps, not seconds of the --minutes budget
    assert json.loads((out / "trainer.json").read_text())["step"] == 3
    assert (out / "model.safetensors").is_file() and (out / "vocab.json").is_file()
