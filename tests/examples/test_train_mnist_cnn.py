"""examples/train_mnist_cnn.py: the synthetic mode trains to high accuracy and saves weights that a PyTorch
LeNet loads to the same outputs; one SGD step of the CNN equals PyTorch's."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "train_mnist_cnn.py"


@pytest.fixture(scope="module")
def cnn() -> ModuleType:
    pytest.importorskip("tqdm")
    spec = importlib.util.spec_from_file_location("train_mnist_cnn", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["train_mnist_cnn"] = module
    spec.loader.exec_module(module)
    return module


def _torch_lenet(dropout: float = 0.25):  # type: ignore[no-untyped-def]
    torch = pytest.importorskip("torch")
    tn = torch.nn
    return tn.Sequential(
        tn.Conv2d(1, 6, 5, padding=2),
        tn.BatchNorm2d(6),
        tn.ReLU(),
        tn.MaxPool2d(2),
        tn.Conv2d(6, 16, 5),
        tn.BatchNorm2d(16),
        tn.ReLU(),
        tn.MaxPool2d(2),
        tn.Flatten(),
        tn.Linear(400, 120),
        tn.ReLU(),
        tn.Dropout(dropout),
        tn.Linear(120, 84),
        tn.ReLU(),
        tn.Linear(84, 10),
    )


def test_synthetic_training_reaches_high_accuracy_and_saves(
    cnn: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import kael
    import torch
    from kael.io import load_safetensors

    out = tmp_path / "cnn.safetensors"
    assert cnn.main(["--synthetic", "600", "--epochs", "2", "--no-progress", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    acc = float(re.search(r"test accuracy (\d\.\d+)", text).group(1))  # type: ignore[union-attr]
    assert acc >= 0.9, text
    assert len(re.findall(r"^epoch \d: train loss", text, re.M)) == 2
    state = load_safetensors(str(out))
    t = _torch_lenet()
    t.load_state_dict({k: torch.tensor(v.numpy()) for k, v in state.items()})
    t.eval()
    k = cnn.make_model()
    k.load_state_dict(state)
    k.eval()
    x, _ = cnn.synthetic_split(8, seed=5)
    with torch.no_grad():
        want = t(torch.tensor(x.numpy())).numpy()
    np.testing.assert_allclose(k(x).detach().numpy(), want, rtol=1e-4, atol=1e-4)
    with kael.no_grad():
        assert k(x).shape == (8, 10)


def test_one_sgd_step_matches_torch(cnn: ModuleType) -> None:
    import kael
    import torch

    torch.manual_seed(0)
    t = _torch_lenet(dropout=0.0)
    k = cnn.make_model(dropout=0.0)
    k.load_state_dict({name: kael.tensor(v.numpy()) for name, v in t.state_dict().items()})
    x, y = cnn.synthetic_split(16, seed=3)
    ko = kael.optim.SGD(k.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
    to = torch.optim.SGD(t.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
    tx, ty = torch.tensor(x.numpy()), torch.tensor(y.numpy())
    for _ in range(2):
        loss, acc = cnn.train_epoch(k, [(x, y)], ko)
        to.zero_grad()
        tl = torch.nn.functional.cross_entropy(t(tx), ty)
        tl.backward()
        to.step()
        assert loss == pytest.approx(tl.item(), rel=1e-4)
    for name, v in t.state_dict().items():
        np.testing.assert_allclose(k.state_dict()[name].numpy(), v.numpy(), rtol=1e-3, atol=1e-5, err_msg=name)


def test_synthetic_needs_ten_images(cnn: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cnn.main(["--synthetic", "3"])
    assert "--synthetic needs at least 10 images" in capsys.readouterr().err


def test_compare_torch_reaches_the_same_accuracy(
    cnn: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("torch")
    args = ["--synthetic", "500", "--epochs", "2", "--dropout", "0", "--compare-torch", "--no-progress"]
    assert cnn.main([*args, "--out", str(tmp_path / "c.safetensors")]) == 0
    text = capsys.readouterr().out
    diffs = [float(v) for v in re.findall(r"kael - torch = ([+-]\d+\.\d+) points", text)]
    assert len(diffs) == 2, text
    assert abs(diffs[-1]) <= 0.5, text  # same weights, batches and schedule: the same accuracy
