"""Train a multi-layer perceptron on MNIST with kael, and save it as safetensors.

    python examples/train_mnist.py --data DIR [--epochs 3] [--hidden 256] [--lr 0.1] [--out mnist_mlp.safetensors]

DIR holds the four MNIST IDX files (``train-images-idx3-ubyte``,
``train-labels-idx1-ubyte``, ``t10k-images-idx3-ubyte``, ``t10k-labels-idx1-ubyte``;
``.`` instead of the last ``-`` and a ``.gz`` suffix are accepted too). A tqdm
progress bar shows the running loss and accuracy. ``train_epoch`` and
``evaluate`` are importable: the test suite trains through them.
"""

from __future__ import annotations

import argparse
import gzip
import os
import sys
from collections.abc import Iterable
from typing import Any

import kael
from kael import nn
from kael.data import DataLoader, TensorDataset, read_idx_dataset

__all__ = ["find_split", "load_split", "make_model", "train_epoch", "evaluate", "main"]


def find_split(data_dir: str, split: str) -> tuple[str, str]:
    """The (images, labels) paths of split "train" or "t10k" in data_dir."""
    found = []
    for kind, dims in (("images", 3), ("labels", 1)):
        names = [f"{split}-{kind}-idx{dims}-ubyte", f"{split}-{kind}.idx{dims}-ubyte"]
        names += [n + ".gz" for n in names]
        paths = [os.path.join(data_dir, n) for n in names if os.path.exists(os.path.join(data_dir, n))]
        if not paths:
            raise FileNotFoundError(f"no {split} {kind} file in {data_dir!r}; expected one of {names}")
        found.append(paths[0])
    return found[0], found[1]


def _ungzip(path: str, tmp_dir: str) -> str:
    """A .gz file decompressed next to its siblings in tmp_dir (the IDX reader wants a plain file)."""
    if not path.endswith(".gz"):
        return path
    out = os.path.join(tmp_dir, os.path.basename(path)[:-3])
    if not os.path.exists(out):
        with gzip.open(path, "rb") as src, open(out, "wb") as dst:
            dst.write(src.read())
    return out


def load_split(data_dir: str, split: str, tmp_dir: str | None = None) -> tuple[kael.Tensor, kael.Tensor]:
    """Images as float32 [N, rows*cols] scaled to [0, 1], and labels as int64 [N]."""
    images, labels = find_split(data_dir, split)
    if images.endswith(".gz") or labels.endswith(".gz"):
        import tempfile

        tmp_dir = tmp_dir or tempfile.mkdtemp(prefix="kael-mnist-")
        images, labels = _ungzip(images, tmp_dir), _ungzip(labels, tmp_dir)
    x, y = read_idx_dataset(images, labels)
    x = x.reshape(x.shape[0], -1).to(dtype=kael.float32) / 255.0
    return x, y.to(dtype=kael.int64)


def make_model(in_features: int = 784, hidden: int = 256, classes: int = 10) -> nn.Module:
    """in_features -> hidden -> ReLU -> classes."""
    return nn.Sequential(nn.Linear(in_features, hidden), nn.ReLU(), nn.Linear(hidden, classes))


def _correct(logits: kael.Tensor, y: kael.Tensor) -> int:
    return int(kael.sum(kael.eq(kael.argmax(logits, 1), y)).item())


def train_epoch(
    model: nn.Module,
    loader: Iterable[Any],
    optimizer: kael.optim.Optimizer,
    scheduler: Any = None,
    progress: Any = None,
) -> tuple[float, float]:
    """One pass over loader, one optimizer step per batch; returns (mean loss, accuracy).

    scheduler: a learning-rate scheduler stepped after each optimizer step, or None.
    progress: a tqdm bar (or anything with update/set_postfix) to report to, or None.
    """
    model.train()
    total_loss, correct, seen = 0.0, 0, 0
    for x, y in loader:
        optimizer.zero_grad()
        logits = model(x)
        loss = nn.functional.cross_entropy(logits, y)
        loss.backward()
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
        n = y.shape[0]
        total_loss += float(loss.item()) * n
        correct += _correct(logits.detach(), y)
        seen += n
        if progress is not None:
            progress.update(1)
            progress.set_postfix(loss=f"{total_loss / seen:.4f}", acc=f"{correct / seen:.4f}", refresh=False)
    return total_loss / max(seen, 1), correct / max(seen, 1)


def evaluate(model: nn.Module, loader: Iterable[Any]) -> tuple[float, float]:
    """Mean loss and accuracy over loader, without recording gradients."""
    model.eval()
    total_loss, correct, seen = 0.0, 0, 0
    with kael.no_grad():
        for x, y in loader:
            logits = model(x)
            n = y.shape[0]
            total_loss += float(nn.functional.cross_entropy(logits, y, reduction="sum").item())
            correct += _correct(logits, y)
            seen += n
    return total_loss / max(seen, 1), correct / max(seen, 1)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True, help="directory with the MNIST IDX files")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="mnist_mlp.safetensors", help="where to save the trained weights")
    ap.add_argument("--no-progress", action="store_true", help="print one line per epoch instead of a bar")
    args = ap.parse_args(argv)

    from tqdm import tqdm

    kael.manual_seed(args.seed)
    x_train, y_train = load_split(args.data, "train")
    x_test, y_test = load_split(args.data, "t10k")
    train = DataLoader(TensorDataset(x_train, y_train), batch_size=args.batch_size, shuffle=True, seed=args.seed)
    test = DataLoader(TensorDataset(x_test, y_test), batch_size=1000)
    model = make_model(x_train.shape[1], args.hidden, int(kael.amax(y_train).item()) + 1)
    optimizer = kael.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    sched = kael.optim.lr_scheduler.CosineWithWarmupLR(
        optimizer, warmup_steps=min(100, len(train)), total_steps=args.epochs * len(train)
    )
    print(model)
    for epoch in range(1, args.epochs + 1):
        with tqdm(total=len(train), desc=f"epoch {epoch}/{args.epochs}", disable=args.no_progress) as bar:
            loss, acc = train_epoch(model, train, optimizer, sched, progress=bar)
            test_loss, test_acc = evaluate(model, test)
            bar.set_postfix(loss=f"{loss:.4f}", acc=f"{acc:.4f}", test_acc=f"{test_acc:.4f}")
        print(f"epoch {epoch}: train loss {loss:.4f} acc {acc:.4f} | test loss {test_loss:.4f} acc {test_acc:.4f}")

    from kael.io import save_safetensors

    save_safetensors(model.state_dict(), args.out)
    print(f"saved {sum(p.numel() for p in model.parameters())} parameters to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
