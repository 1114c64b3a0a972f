"""The program tests/distributed/test_mpi.py runs under ``mpiexec -n 2``, one scenario per run.

    mpiexec -n 2 python tests/distributed/mpi_worker.py SCENARIO OUT_DIR [ARGS...]

``train`` takes OPTIMIZER STEPS ROWS_PER_RANK BUCKET_CAP_MB MICRO_BATCHES DTYPE.

Scenarios: ``train`` (DDP training steps, each rank's final parameters and per-step
all-reduce counts saved to OUT_DIR/rank{r}.npz), ``collectives`` (all_reduce, broadcast,
all_gather, barrier on several dtypes and strides, checked against NumPy here; OUT_DIR/ok{r}
marks success), ``raise`` (rank 1 raises at step 2), ``exit`` (rank 1 calls sys.exit(3) at
step 2), ``hang`` (rank 1 sleeps at step 2 for longer than the test waits), ``mismatch`` (rank 1's model has another shape; each rank writes the error it got),
``peer`` (rank 1 waits for SIGTERM and writes the pid that sent it to OUT_DIR/sigterm_from, rank 0
writes its pid to OUT_DIR/pid0 and raises),
``unused`` (rank 0 uses one head of a TwoHeads model, rank 1 the other; the gradients after one
backward are saved to OUT_DIR/grads{r}.npz).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from typing import Any

import kael
import kael.distributed as dist
import numpy as np
from kael import nn, optim
from kael.nn.parallel import DistributedDataParallel

__all__ = ["TwoHeads", "batch", "make_model", "make_optimizer", "mlp_loss"]

IN, HIDDEN, OUT = 5, 7, 3


def make_model(seed: int, hidden: int = HIDDEN, dtype: str = "float64") -> nn.Module:
    """A two-layer MLP of float32 or float64 parameters."""
    kael.manual_seed(seed)
    model = nn.Sequential(nn.Linear(IN, hidden), nn.ReLU(), nn.Linear(hidden, OUT))
    return model.double() if dtype == "float64" else model.float()


def make_optimizer(name: str, params: Any) -> optim.Optimizer:
    if name == "sgd":
        return optim.SGD(params, lr=0.1, momentum=0.9)
    return optim.AdamW(params, lr=0.01, weight_decay=0.1)


def batch(step: int, rows: int, dtype: str = "float64") -> tuple[kael.Tensor, kael.Tensor]:
    """The global batch of a step: `rows` rows (the same on every rank and in the reference)."""
    rng = np.random.default_rng(100 + step)
    x, y = rng.standard_normal((rows, IN)).astype(dtype), rng.standard_normal((rows, OUT)).astype(dtype)
    return kael.from_numpy(x), kael.from_numpy(y)


def mlp_loss(model: Any, x: kael.Tensor, y: kael.Tensor) -> kael.Tensor:
    """Mean squared error, a mean over the batch (so the ranks' average is the global batch's)."""
    return ((model(x) - y) ** 2).mean()


def train(out: str, opt_name: str, steps: int, per_rank: int, cap_mb: float, accumulate: int, dtype: str) -> None:
    r, n = dist.rank(), dist.world_size()
    model = make_model(seed=r, dtype=dtype)  # different on each rank: DDP must broadcast rank 0's
    ddp = DistributedDataParallel(model, bucket_cap_mb=cap_mb)
    opt = make_optimizer(opt_name, model.parameters())
    calls: list[int] = []
    reduced: list[int] = []
    real = dist.all_reduce

    def counting(t: kael.Tensor, *args: Any, **kwargs: Any) -> Any:
        calls[-1] += 1
        reduced[-1] += t.numel()
        return real(t, *args, **kwargs)

    dist.all_reduce = counting  # type: ignore[assignment]  # DDP calls it through the module
    # overlap: how many buckets had started when backward reached the first layer's weight
    started: list[int] = []
    model[0].weight.register_post_accumulate_grad_hook(lambda p: started.append(calls[-1]))
    before = ddp.reduce_calls
    for step in range(steps):
        calls.append(0)
        reduced.append(0)
        x, y = batch(step, per_rank * n * accumulate, dtype)
        opt.zero_grad()
        chunks = [(i * n + r) * per_rank for i in range(accumulate)]
        for i, lo in enumerate(chunks):
            xs, ys = x[lo : lo + per_rank], y[lo : lo + per_rank]
            if i < accumulate - 1:
                with ddp.no_sync():
                    (mlp_loss(ddp, xs, ys) / accumulate).backward()
            else:
                (mlp_loss(ddp, xs, ys) / accumulate).backward()
        opt.step()
    dist.all_reduce = real  # type: ignore[assignment]
    arrays = {f"p.{name}": p.detach().numpy() for name, p in model.named_parameters()}
    np.savez(
        os.path.join(out, f"rank{r}.npz"),
        calls=np.array(calls),
        reduced=np.array(reduced),
        started=np.array(started),
        reduce_calls=np.array(ddp.reduce_calls - before),
        buckets=np.array(len(ddp.buckets)),
        bucket_names=np.array(json.dumps(ddp.buckets)),
        **arrays,
    )


def collectives(out: str) -> None:
    r, n = dist.rank(), dist.world_size()
    base = np.arange(12, dtype=np.float64).reshape(3, 4)
    vals = [base * (q + 1) - q for q in range(n)]  # rank q's values
    for name in ("float32", "float64", "int32", "int64", "bfloat16", "float16"):
        dtype = getattr(kael, name)
        t = kael.tensor(vals[r]).to(dtype)
        dist.all_reduce(t)
        np.testing.assert_array_equal(t.float().numpy(), sum(vals), err_msg=name)
        for op, oracle in (("max", np.max), ("min", np.min)):
            t = kael.tensor(vals[r]).to(dtype)
            dist.all_reduce(t, op=op)
            np.testing.assert_array_equal(t.float().numpy(), oracle(vals, axis=0), err_msg=f"{name} {op}")
    flags = kael.tensor(np.array([r == 0, False, True]))
    dist.all_reduce(flags)
    assert flags.tolist() == [True, False, True]
    # a strided view: the transpose of a row slice, averaged in place; the rest of its base untouched
    big = kael.tensor(np.stack([vals[r], -np.ones((3, 4))]))
    view = big[0].T
    assert not view.is_contiguous()
    dist.all_reduce(view, op=dist.ReduceOp.AVG)
    np.testing.assert_array_equal(big.numpy()[0], sum(vals) / n)
    np.testing.assert_array_equal(big.numpy()[1], -np.ones((3, 4)))
    work = dist.all_reduce(kael.tensor([float(r)]), async_op=True)
    work.wait()
    for name in ("float32", "bfloat16", "int64", "bool"):
        dtype = getattr(kael, name)
        b = kael.tensor(vals[r][:, :2] > 5 if name == "bool" else vals[r][:, :2]).to(dtype)
        dist.broadcast(b.T, src=n - 1)  # a strided view again
        want = vals[n - 1][:, :2]
        np.testing.assert_array_equal(b.float().numpy(), want > 5 if name == "bool" else want, err_msg=name)
        outs = [kael.zeros(2, 3, dtype=dtype) for _ in range(n)]
        dist.all_gather(outs, kael.tensor(vals[r][:2, :3] > 5 if name == "bool" else vals[r][:2, :3]).to(dtype))
        for q in range(n):
            want = vals[q][:2, :3]
            np.testing.assert_array_equal(outs[q].float().numpy(), want > 5 if name == "bool" else want)
    if os.environ.get("KAEL_CUDA_EMULATE") == "1":  # the host-staging path of a non-CPU device
        c = kael.tensor(vals[r]).to("cuda")
        dist.all_reduce(c.T, op="avg")
        np.testing.assert_array_equal(c.cpu().numpy(), sum(vals) / n)
        dist.broadcast(c, src=1)
        np.testing.assert_array_equal(c.cpu().numpy(), sum(vals) / n)
    dist.barrier()
    with open(os.path.join(out, f"ok{r}"), "w") as f:
        f.write("ok")


def fail_at_step_2(how: str) -> None:
    model = make_model(seed=0)
    ddp = DistributedDataParallel(model)
    opt = make_optimizer("sgd", model.parameters())
    for step in range(5):
        print(f"rank {dist.rank()} step {step}", flush=True)
        if step == 2 and dist.rank() == 1:
            if how == "raise":
                raise RuntimeError("rank 1 fails on purpose at step 2")
            if how == "hang":
                time.sleep(600)
            sys.exit(3)
        x, y = batch(step, 4)
        opt.zero_grad()
        mlp_loss(ddp, x, y).backward()
        opt.step()
    print(f"rank {dist.rank()} finished", flush=True)


class TwoHeads(nn.Module):
    """A body and two heads, of which each forward uses one; a third layer no forward uses."""

    def __init__(self) -> None:
        super().__init__()
        kael.manual_seed(0)
        self.body = nn.Linear(IN, HIDDEN).double()
        self.a = nn.Linear(HIDDEN, OUT).double()
        self.b = nn.Linear(HIDDEN, OUT).double()
        self.never = nn.Linear(2, 2).double()

    def forward(self, x: kael.Tensor, head: str) -> kael.Tensor:
        return (self.a if head == "a" else self.b)(self.body(x).relu())


def unused(out: str) -> None:
    r = dist.rank()
    model = TwoHeads()
    ddp = DistributedDataParallel(model, bucket_cap_mb=1e-4)
    x, y = batch(0, 8)
    mlp_loss(lambda v: ddp(v, head="ab"[r]), x[r * 4 : r * 4 + 4], y[r * 4 : r * 4 + 4]).backward()
    grads = {name: p.grad.numpy() for name, p in model.named_parameters() if p.grad is not None}
    np.savez(os.path.join(out, f"grads{r}.npz"), reduce_calls=np.array(ddp.reduce_calls), **grads)


def mismatch(out: str) -> None:
    model = make_model(seed=0, hidden=HIDDEN + dist.rank())
    try:
        DistributedDataParallel(model)
    except dist.DistributedError as exc:
        with open(os.path.join(out, f"error{dist.rank()}"), "w") as f:
            f.write(str(exc))


def sigterm_from_the_failed_peer(out: str) -> None:
    if dist.rank() == 1:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # the first SIGTERM's sender is kept
    dist.barrier()
    if dist.rank() == 0:
        with open(os.path.join(out, "pid0"), "w") as f:
            f.write(str(os.getpid()))
        raise RuntimeError("rank 0 fails on purpose")
    info = signal.sigtimedwait({signal.SIGTERM}, 60)
    with open(os.path.join(out, "sigterm_from"), "w") as f:
        f.write(str(info.si_pid) if info is not None else "none")


def main() -> None:
    scenario, out = sys.argv[1], sys.argv[2]
    dist.init(timeout=float(os.environ.get("WORKER_TIMEOUT", "120")))
    assert dist.world_size() == 2, dist.world_size()
    if scenario == "train":
        opt_name, steps, per_rank, cap, accumulate, dtype = sys.argv[3:9]
        train(out, opt_name, int(steps), int(per_rank), float(cap), int(accumulate), dtype)
    elif scenario == "collectives":
        collectives(out)
    elif scenario in ("raise", "exit", "hang"):
        fail_at_step_2(scenario)
    elif scenario == "mismatch":
        mismatch(out)
    elif scenario == "unused":
        unused(out)
    elif scenario == "peer":
        sigterm_from_the_failed_peer(out)
    else:
        raise SystemExit(f"unknown scenario {scenario!r}")


if __name__ == "__main__":
    main()
