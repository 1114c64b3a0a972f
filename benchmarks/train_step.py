"""Milliseconds per training step of a 784-256-10 MLP (or, with --model cnn, a LeNet-style CNN): kael against PyTorch.

One step is zero_grad, forward (Linear, ReLU, Linear), cross-entropy, backward and
an SGD update, on a batch of 64 random float32 inputs. Both frameworks start from
the same weights and batch; the script reports the median time per step over
several timed runs after a warm-up, the backend kael used, and how far the two
losses drift apart over the timed steps (a sanity check that both do the same work).
``kael_frontend_ms_per_step`` is the same step on a backend whose kernels do
nothing, in thread CPU time: the Python cost of kael's frontend, autograd and
optimizer per step, which any backend's kernel time adds to.

    python benchmarks/train_step.py [--steps 200] [--repeats 5] [--batch 64] [--threads N] [--model mlp|cnn]

``--model cnn`` times examples/train_mnist_cnn.py's model (two 5x5 convolutions with batch
norm, ReLU and 2x2 max pooling, then 400-120-84-10; dropout 0 so both do the same work) on
[batch, 1, 28, 28] inputs, with SGD with momentum; the torch model's initial weights are
loaded into kael's; its kael and torch runs alternate (``time_interleaved``), so a change in
the machine's load (other processes) slows both alike. The frontend-only figure is reported
for the MLP only.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import kael
import numpy as np
from kael import nn

IN, HIDDEN, OUT = 784, 256, 10


def make_data(batch: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    b1, b2 = 1 / np.sqrt(IN), 1 / np.sqrt(HIDDEN)
    return {
        "x": rng.standard_normal((batch, IN)).astype(np.float32),
        "y": rng.integers(0, OUT, batch).astype(np.int64),
        "w1": rng.uniform(-b1, b1, (HIDDEN, IN)).astype(np.float32),
        "b1": rng.uniform(-b1, b1, HIDDEN).astype(np.float32),
        "w2": rng.uniform(-b2, b2, (OUT, HIDDEN)).astype(np.float32),
        "b2": rng.uniform(-b2, b2, OUT).astype(np.float32),
    }


def kael_step(d: dict[str, np.ndarray], lr: float) -> Callable[[], float]:
    model = nn.Sequential(nn.Linear(IN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, OUT))
    model.load_state_dict(
        {
            "0.weight": kael.from_numpy(d["w1"]),
            "0.bias": kael.from_numpy(d["b1"]),
            "2.weight": kael.from_numpy(d["w2"]),
            "2.bias": kael.from_numpy(d["b2"]),
        }
    )
    opt = kael.optim.SGD(model.parameters(), lr=lr)
    x, y = kael.from_numpy(d["x"]), kael.from_numpy(d["y"])
    cross_entropy = nn.functional.cross_entropy

    def step() -> Any:
        opt.zero_grad()
        loss = cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss

    return step


def frontend_ms(d: dict[str, np.ndarray], lr: float, steps: int, repeats: int) -> float:
    """ms per step with a CPU backend whose kernels do nothing: the frontend's own cost (ops, autograd,
    optimizer), i.e. what kael adds on top of any backend's kernel time."""
    from kael.backends.reference import ReferenceBackend

    class NullBackend(ReferenceBackend):
        name, priority = "null_kernels", -1

        def __init__(self) -> None:
            super().__init__()
            self.kernels = {k: (lambda *a, **kw: None) for k in self.kernels}

    class Plugin:
        @kael.hookimpl
        def kael_backends(self) -> list[Any]:
            return [NullBackend()]

    step = kael_step(d, lr)  # weights loaded through the real backend
    kael.backends.register(Plugin(), "benchmark_null_kernels")
    kael.backends.use("cpu", "null_kernels")
    try:
        # the calling thread's CPU time: this part is single-threaded Python, and CPU time is not
        # inflated when other processes compete for the cores
        ms, _ = time_steps(step, steps, repeats, keep_losses=False, clock=time.thread_time)
    finally:
        kael.backends.use("cpu", None)
        kael.backends.unregister("benchmark_null_kernels")
    return ms


def torch_step(d: dict[str, np.ndarray], lr: float) -> Callable[[], Any] | None:
    try:
        import torch
    except ImportError:
        return None
    model = torch.nn.Sequential(torch.nn.Linear(IN, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, OUT))
    with torch.no_grad():
        for p, k in zip(model.parameters(), ("w1", "b1", "w2", "b2")):
            p.copy_(torch.from_numpy(d[k]))
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    x, y = torch.from_numpy(d["x"]), torch.from_numpy(d["y"])
    cross_entropy = torch.nn.functional.cross_entropy

    def step() -> Any:
        opt.zero_grad()
        loss = cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss

    return step


def _cnn_layers(m: Any) -> Any:
    """LeNet-style CNN built from module namespace m (kael.nn or torch.nn), as in examples/train_mnist_cnn.py."""
    return m.Sequential(
        m.Conv2d(1, 6, 5, padding=2),
        m.BatchNorm2d(6),
        m.ReLU(),
        m.MaxPool2d(2),
        m.Conv2d(6, 16, 5),
        m.BatchNorm2d(16),
        m.ReLU(),
        m.MaxPool2d(2),
        m.Flatten(),
        m.Linear(400, 120),
        m.ReLU(),
        m.Linear(120, 84),
        m.ReLU(),
        m.Linear(84, OUT),
    )


def cnn_steps(batch: int, lr: float) -> tuple[Callable[[], Any], Callable[[], Any] | None]:
    """(kael step, torch step or None): zero_grad, CNN forward, cross-entropy, backward, SGD(momentum) update."""
    rng = np.random.default_rng(0)
    x_np = rng.random((batch, 1, 28, 28), dtype=np.float32)
    y_np = rng.integers(0, OUT, batch).astype(np.int64)
    kmodel = _cnn_layers(nn)
    tstep = None
    torch: Any = None
    try:
        import torch
    except ImportError:
        pass
    if torch is not None:
        torch.manual_seed(0)
        tmodel = _cnn_layers(torch.nn)
        kmodel.load_state_dict({k: kael.from_numpy(v.numpy().copy()) for k, v in tmodel.state_dict().items()})
        topt = torch.optim.SGD(tmodel.parameters(), lr=lr, momentum=0.9)
        tx, ty = torch.from_numpy(x_np), torch.from_numpy(y_np)

        def tstep() -> Any:
            topt.zero_grad()
            loss = torch.nn.functional.cross_entropy(tmodel(tx), ty)
            loss.backward()
            topt.step()
            return loss

    kopt = kael.optim.SGD(kmodel.parameters(), lr=lr, momentum=0.9)
    kx, ky = kael.from_numpy(x_np), kael.from_numpy(y_np)

    def kstep() -> Any:
        kopt.zero_grad()
        loss = nn.functional.cross_entropy(kmodel(kx), ky)
        loss.backward()
        kopt.step()
        return loss

    return kstep, tstep


def time_steps(
    step: Callable[[], Any],
    steps: int,
    repeats: int,
    keep_losses: bool = True,
    clock: Callable[[], float] = time.perf_counter,
) -> tuple[float, list[float]]:
    """Median ms per step over `repeats` runs of `steps` steps (after a warm-up), and the losses of one run."""
    for _ in range(10):
        step()
    times, losses = [], []
    for r in range(repeats):
        run_losses = []
        start = clock()
        for _ in range(steps):
            run_losses.append(step())
        times.append((clock() - start) * 1e3 / steps)
        if r == 0 and keep_losses:
            losses = [float(v.item()) for v in run_losses]
    return statistics.median(times), losses


def time_interleaved(
    kstep: Callable[[], Any], tstep: Callable[[], Any], steps: int, repeats: int
) -> tuple[float, list[float], float, list[float]]:
    """Median ms per step of kael and torch, their timed runs alternating (kael, torch, kael, ...) after a warm-up
    of both, so a change in the machine's load (other processes) falls on both alike; and the losses of the first
    run of each."""
    for _ in range(10):
        kstep()
        tstep()
    times: tuple[list[float], list[float]] = ([], [])
    losses: tuple[list[float], list[float]] = ([], [])
    for r in range(repeats):
        for i, step in enumerate((kstep, tstep)):
            run = []
            start = time.perf_counter()
            for _ in range(steps):
                run.append(step())
            times[i].append((time.perf_counter() - start) * 1e3 / steps)
            if r == 0:
                losses[i].extend(float(v.item()) for v in run)
    return statistics.median(times[0]), losses[0], statistics.median(times[1]), losses[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--threads", type=int, default=0, help="intra-op threads for both (0: each one's default)")
    ap.add_argument("--model", choices=("mlp", "cnn"), default="mlp", help="the MLP (default) or the LeNet-style CNN")
    args = ap.parse_args()

    d = make_data(args.batch)
    report: dict[str, Any] = {
        "benchmark": "train_step_mlp_784_256_10" if args.model == "mlp" else "train_step_cnn_lenet_bn",
        "python": sys.version.split()[0],
        "batch": args.batch,
        "steps_per_run": args.steps,
        "runs": args.repeats,
        "kael_backend": kael.backends.current("cpu").name,
    }
    if args.threads:
        try:
            kael.set_num_threads(args.threads)
        except (AttributeError, ImportError):
            pass
    if args.model == "cnn":
        kstep, step = cnn_steps(args.batch, args.lr)
        if step is not None:  # torch present: alternate the timed runs (time_interleaved)
            import torch

            if args.threads:
                torch.set_num_threads(args.threads)
            kael_ms, kael_losses, torch_ms, torch_losses = time_interleaved(kstep, step, args.steps, args.repeats)
            report["kael_ms_per_step"] = round(kael_ms, 4)
            report["torch_version"] = torch.__version__
            report["torch_threads"] = torch.get_num_threads()
            report["torch_ms_per_step"] = round(torch_ms, 4)
            report["kael_over_torch"] = round(kael_ms / torch_ms, 3)
            report["max_loss_difference"] = float(np.max(np.abs(np.array(kael_losses) - np.array(torch_losses))))
            report["timing"] = "interleaved runs (kael, torch, kael, ...), median of each"
            print(json.dumps(report, indent=2))
            return
        kael_ms, kael_losses = time_steps(kstep, args.steps, args.repeats)
        report["kael_ms_per_step"] = round(kael_ms, 4)
    else:
        kael_ms, kael_losses = time_steps(kael_step(d, args.lr), args.steps, args.repeats)
        report["kael_ms_per_step"] = round(kael_ms, 4)
        report["kael_frontend_ms_per_step"] = round(frontend_ms(d, args.lr, args.steps, args.repeats), 4)
        step = torch_step(d, args.lr)
    if step is None:
        report["torch"] = "not installed"
    else:
        import torch

        if args.threads:
            torch.set_num_threads(args.threads)
        report["torch_version"] = torch.__version__
        report["torch_threads"] = torch.get_num_threads()
        torch_ms, torch_losses = time_steps(step, args.steps, args.repeats)
        report["torch_ms_per_step"] = round(torch_ms, 4)
        report["kael_over_torch"] = round(kael_ms / torch_ms, 3)
        report["max_loss_difference"] = float(np.max(np.abs(np.array(kael_losses) - np.array(torch_losses))))
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
