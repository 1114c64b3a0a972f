"""examples/train_gpt.py --distributed under ``mpiexec -n 2``: a few steps of a tiny model, rank 0
alone logs and writes the checkpoint (each rank is given its own --out, through mpiexec's
``A : B`` form, so a checkpoint written by rank 1 would show). Skipped without mpi4py/mpiexec."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "train_gpt.py"
TINY = ["--layers", "1", "--heads", "1", "--dimension", "16", "--context", "16", "--batch-size", "2"]


def _mpiexec() -> str | None:
    beside = Path(sys.executable).with_name("mpiexec")
    return str(beside) if beside.exists() else shutil.which("mpiexec")


MPIEXEC = _mpiexec()
pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("mpi4py") is None or MPIEXEC is None or importlib.util.find_spec("tqdm") is None,
    reason="needs mpi4py, mpiexec (pip install mpi4py mpich) and tqdm",
)


def test_two_ranks_train_and_only_rank_0_writes_the_checkpoint(tmp_path: Path) -> None:
    assert MPIEXEC is not None
    args = [*TINY, "--steps", "3", "--corpus-mb", "4", "--eval-every", "2", "--eval-batches", "1", "--distributed"]
    rank = [sys.executable, str(SCRIPT), *args, "--out"]
    out0, out1 = tmp_path / "rank0", tmp_path / "rank1"
    proc = subprocess.run(
        [MPIEXEC, "-n", "1", *rank, str(out0), ":", "-n", "1", *rank, str(out1)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "KAEL_NUM_THREADS": "1"},
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    (summary,) = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]  # rank 0's only
    assert summary["steps"] == 3
    assert proc.stderr.count("model: 7,680 parameters, 2 ranks") == 1
    trainer = json.loads((out0 / "trainer.json").read_text())
    assert trainer["step"] == 3 and trainer["tokens"] == 3 * 2 * 16 * 2  # steps * batch * context * ranks
    assert [h["step"] for h in trainer["history"]] == [2]  # the evaluation at step 2, by rank 0
    for name in ("model.safetensors", "optimizer.safetensors", "config.json", "vocab.json"):
        assert (out0 / name).is_file()
    assert not out1.exists()  # rank 1 wrote nothing
