"""Train a LeNet-style CNN (convolutions, batch norm, dropout) on MNIST with kael, and save it as safetensors.

    python examples/train_mnist_cnn.py --data DIR [--epochs 3] [--lr 0.05] [--out mnist_cnn.safetensors]
    python examples/train_mnist_cnn.py --synthetic 2000 [--epochs 2] [--compare-torch]

DIR holds the four MNIST IDX files, as for ``examples/train_mnist.py`` (whose loaders,
``train_epoch`` and ``evaluate`` this script reuses). ``--synthetic N`` trains on N
generated 28x28 digits-like images instead (ten noisy class templates, a test split of
N/5), which needs no download and is what the test suite runs. SGD with momentum and a
cosine schedule with warmup; a tqdm progress bar shows the running loss and accuracy.
``--compare-torch`` trains the same network in PyTorch alongside (same initial weights,
same batches in the same order, same optimizer and schedule) and reports both test
accuracies and their difference in points.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import kael
import numpy as np
from kael import nn
from kael.data import DataLoader, TensorDataset

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_mnist import evaluate, load_split, train_epoch

__all__ = ["make_model", "make_torch_model", "synthetic_split", "main", "train_epoch", "evaluate"]


def make_model(classes: int = 10, dropout: float = 0.25) -> nn.Module:
    """LeNet-5 with batch norm: [N, 1, 28, 28] -> conv5(6) -> pool -> conv5(16) -> pool -> 120 -> 84 -> classes."""
    return nn.Sequential(
        nn.Conv2d(1, 6, 5, padding=2),
        nn.BatchNorm2d(6),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(6, 16, 5),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(16 * 5 * 5, 120),
        nn.ReLU(),
        nn.Dropout(dropout),
        nn.Linear(120, 84),
        nn.ReLU(),
        nn.Linear(84, classes),
    )


def make_torch_model(model: nn.Module, dropout: float = 0.25) -> Any:
    """The same network in PyTorch, with ``model``'s current weights (torch imported here, on demand)."""
    import torch

    layers: list[Any] = []
    for m in model.children():  # type: ignore[attr-defined]
        name = type(m).__name__
        if name == "Conv2d":
            layers.append(torch.nn.Conv2d(m.in_channels, m.out_channels, m.kernel_size, padding=m.padding))
        elif name == "BatchNorm2d":
            layers.append(torch.nn.BatchNorm2d(m.num_features))
        elif name == "MaxPool2d":
            layers.append(torch.nn.MaxPool2d(m.kernel_size))
        elif name == "Linear":
            layers.append(torch.nn.Linear(m.in_features, m.out_features))
        elif name == "Dropout":
            layers.append(torch.nn.Dropout(dropout))
        else:
            layers.append(getattr(torch.nn, name)())
    t = torch.nn.Sequential(*layers)
    t.load_state_dict({k: torch.tensor(v.numpy()) for k, v in model.state_dict().items()})
    return t


def _torch_epoch(t: Any, batches: list[Any], optimizer: Any, scheduler: Any) -> None:
    import torch

    t.train()
    for x, y in batches:
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(t(torch.tensor(x.numpy())), torch.tensor(y.numpy())).backward()
        optimizer.step()
        scheduler.step()


def _torch_accuracy(t: Any, loader: Any) -> float:
    import torch

    t.eval()
    correct = seen = 0
    with torch.no_grad():
        for x, y in loader:
            correct += int((t(torch.tensor(x.numpy())).argmax(1) == torch.tensor(y.numpy())).sum())
            seen += y.shape[0]
    return correct / max(seen, 1)


def synthetic_split(n: int, seed: int, classes: int = 10) -> tuple[kael.Tensor, kael.Tensor]:
    """n images [n, 1, 28, 28] in [0, 1]: class templates (blurred random strokes, fixed by seed 1234)
    shifted by up to 2 pixels and noised with ``seed``; labels int64 [n]."""
    tmpl_rng = np.random.default_rng(1234)
    templates = np.zeros((classes, 28, 28), np.float32)
    for c in range(classes):
        for _ in range(3):  # three random strokes per class
            r0, c0 = tmpl_rng.integers(4, 24, 2)
            dr, dc = tmpl_rng.integers(-1, 2, 2)
            for t in range(10):
                r, cc = np.clip(r0 + dr * t, 0, 27), np.clip(c0 + dc * t, 0, 27)
                templates[c, max(r - 1, 0) : r + 2, max(cc - 1, 0) : cc + 2] = 1.0
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, classes, n)
    images = np.empty((n, 1, 28, 28), np.float32)
    for i, c in enumerate(labels):
        shifted = np.roll(templates[c], tuple(rng.integers(-2, 3, 2)), axis=(0, 1))
        images[i, 0] = np.clip(shifted + rng.normal(0, 0.3, (28, 28)), 0, 1)
    return kael.tensor(images), kael.tensor(labels.astype(np.int64))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--data", help="directory with the MNIST IDX files")
    src.add_argument("--synthetic", type=int, metavar="N", help="train on N generated images instead")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--weight-decay", type=float, default=5e-4)
    ap.add_argument("--dropout", type=float, default=0.25)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="mnist_cnn.safetensors", help="where to save the trained weights")
    ap.add_argument("--no-progress", action="store_true", help="print one line per epoch instead of a bar")
    ap.add_argument("--compare-torch", action="store_true", help="train the same network in PyTorch alongside")
    args = ap.parse_args(argv)
    if args.synthetic is not None and args.synthetic < 10:
        ap.error(f"--synthetic needs at least 10 images, got {args.synthetic}")

    from tqdm import tqdm

    kael.manual_seed(args.seed)
    if args.data is not None:
        x_train, y_train = load_split(args.data, "train")
        x_test, y_test = load_split(args.data, "t10k")
        x_train, x_test = x_train.reshape(-1, 1, 28, 28), x_test.reshape(-1, 1, 28, 28)
    else:
        x_train, y_train = synthetic_split(args.synthetic, args.seed)
        x_test, y_test = synthetic_split(max(args.synthetic // 5, 10), args.seed + 1)
    train = DataLoader(TensorDataset(x_train, y_train), batch_size=args.batch_size, shuffle=True, seed=args.seed)
    test = DataLoader(TensorDataset(x_test, y_test), batch_size=1000)
    model = make_model(10, args.dropout)
    optimizer = kael.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum, weight_decay=args.weight_decay)
    sched = kael.optim.lr_scheduler.CosineWithWarmupLR(
        optimizer, warmup_steps=min(100, len(train)), total_steps=args.epochs * len(train)
    )
    print(model)
    torch_run = None
    if args.compare_torch:
        import torch
        from kael.optim.lr_scheduler import cosine_with_warmup

        torch.manual_seed(args.seed)
        tmodel = make_torch_model(model, args.dropout)
        topt = torch.optim.SGD(tmodel.parameters(), lr=args.lr, momentum=args.momentum, weight_decay=args.weight_decay)
        warm, total = min(100, len(train)), args.epochs * len(train)
        tsched = torch.optim.lr_scheduler.LambdaLR(topt, lambda s: cosine_with_warmup(s, warm, total))
        torch_run = (tmodel, topt, tsched)
    test_acc = 0.0
    for epoch in range(1, args.epochs + 1):
        batches = list(train)  # one shuffled order for both frameworks
        with tqdm(total=len(train), desc=f"epoch {epoch}/{args.epochs}", disable=args.no_progress) as bar:
            loss, acc = train_epoch(model, batches, optimizer, sched, progress=bar)
            test_loss, test_acc = evaluate(model, test)
            bar.set_postfix(loss=f"{loss:.4f}", acc=f"{acc:.4f}", test_acc=f"{test_acc:.4f}")
        print(f"epoch {epoch}: train loss {loss:.4f} acc {acc:.4f} | test loss {test_loss:.4f} acc {test_acc:.4f}")
        if torch_run is not None:
            _torch_epoch(torch_run[0], batches, torch_run[1], torch_run[2])
            torch_acc = _torch_accuracy(torch_run[0], test)
            print(
                f"epoch {epoch}: torch test acc {torch_acc:.4f} | kael - torch = "
                f"{100 * (test_acc - torch_acc):+.2f} points"
            )

    from kael.io import save_safetensors

    save_safetensors(model.state_dict(), args.out)
    print(f"saved {sum(p.numel() for p in model.parameters())} parameters to {args.out}; test accuracy {test_acc:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
