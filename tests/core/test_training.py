"""End to end: train an MLP on a synthetic IDX data set through the example's own code.

The test writes glyph images (ten noisy 8x8 patterns) and their labels as IDX files,
then trains with ``examples/train_mnist.py``'s ``load_split``/``train_epoch``/
``evaluate`` over ``kael.data.DataLoader``, and runs the example's ``main`` once.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from types import ModuleType

import kael
import numpy as np
import pytest
from kael.data import DataLoader, TensorDataset, write_idx

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_mnist.py"


@pytest.fixture(scope="module")
def example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("kael_example_train_mnist", EXAMPLE)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def make_glyphs(n: int, seed: int, side: int = 8, classes: int = 10) -> tuple[np.ndarray, np.ndarray]:
    """n uint8 images [n, side, side]: a fixed random pattern per class, 8% of pixels flipped, plus noise."""
    protos = np.random.default_rng(1234).random((classes, side, side)) < 0.5
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, classes, n).astype(np.uint8)
    flips = rng.random((n, side, side)) < 0.08
    on = protos[labels] ^ flips
    images = np.clip(on * 200.0 + 30.0 + rng.normal(0, 25, (n, side, side)), 0, 255).astype(np.uint8)
    return images, labels


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("glyphs")
    for split, n, seed in (("train", 3000, 0), ("t10k", 600, 1)):
        images, labels = make_glyphs(n, seed)
        write_idx(d / f"{split}-images-idx3-ubyte", images)
        write_idx(d / f"{split}-labels-idx1-ubyte", labels)
    return d


def test_load_split_reads_the_idx_files(example: ModuleType, data_dir: Path) -> None:
    x, y = example.load_split(str(data_dir), "t10k")
    images, labels = make_glyphs(600, 1)
    assert x.shape == (600, 64) and x.dtype is kael.float32 and y.dtype is kael.int64
    np.testing.assert_allclose(x.numpy(), images.reshape(600, 64) / 255.0, rtol=1e-6)
    np.testing.assert_array_equal(y.numpy(), labels)
    with pytest.raises(FileNotFoundError, match="no valid images file"):
        example.load_split(str(data_dir), "valid")


def test_mlp_trains_to_over_95_percent(example: ModuleType, data_dir: Path) -> None:
    kael.manual_seed(0)
    x, y = example.load_split(str(data_dir), "train")
    xt, yt = example.load_split(str(data_dir), "t10k")
    train = DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True, seed=0)
    test = DataLoader(TensorDataset(xt, yt), batch_size=200)
    model = example.make_model(64, 32, 10)
    opt = kael.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    _, acc_before = example.evaluate(model, test)
    history = [example.train_epoch(model, train, opt) for _ in range(2)]
    test_loss, test_acc = example.evaluate(model, test)
    assert acc_before < 0.3
    assert history[1][0] < history[0][0]  # the training loss went down
    assert test_acc > 0.95, f"test accuracy {test_acc:.3f} after training (losses {history})"
    assert test_loss < 0.3
    assert not model.training  # evaluate switched to eval mode


def test_example_main_trains_and_saves_safetensors(
    example: ModuleType, data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "mlp.safetensors"
    assert example.main(["--data", str(data_dir), "--epochs", "1", "--hidden", "16", "--out", str(out)]) == 0
    printed = capsys.readouterr()
    assert "epoch 1: train loss" in printed.out and f"saved {64 * 16 + 16 + 16 * 10 + 10} parameters" in printed.out
    assert "loss=" in printed.err and "acc=" in printed.err  # the tqdm bar's postfix
    state = kael.load_safetensors(os.fspath(out))
    assert sorted(state) == ["0.bias", "0.weight", "2.bias", "2.weight"]
    assert tuple(state["0.weight"].shape) == (16, 64)
    model = example.make_model(64, 16, 10)
    model.load_state_dict(state)
    _, acc = example.evaluate(model, DataLoader(TensorDataset(*example.load_split(str(data_dir), "t10k")), 300))
    assert acc > 0.8
