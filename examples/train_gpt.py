"""Train a small GPT-2-architecture model with kael on the CPython standard library's source.

The corpus is read from this Python's own stdlib (PSF licence), so nothing is
downloaded. Tokens are bytes: the tokenizer is GPT-2's byte-level BPE with no
merges (256 byte tokens plus <|endoftext|>), written as vocab.json/merges.txt so
kael.BpeTokenizer and kael-server load it like any GPT-2 checkpoint.

    python examples/train_gpt.py --out kael-tiny --minutes 30
    python examples/train_gpt.py --out kael-tiny --resume      # continue
    mpiexec -n 2 python examples/train_gpt.py --distributed --out kael-tiny   # data-parallel

Checkpoints use GPT-2's layout (config.json + model.safetensors) plus the
optimizer state (optimizer.safetensors, trainer.json) for --resume.

With --distributed (under mpiexec; pip install mpi4py mpich), each rank trains
on --batch-size windows per step, drawn by a DistributedSampler from the
training stream cut into --context windows, and DistributedDataParallel
averages the gradients; rank 0 alone logs, evaluates and writes checkpoints,
and its clock decides the learning rate and when the --minutes budget ends.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import io
import json
import math
import os
import sys
import sysconfig
import time
from typing import Any

import kael
import kael.distributed as dist
import numpy as np
from kael import nn, optim
from kael.data import DataLoader, DistributedSampler
from kael.models import GPT, save_pretrained
from kael.nn.parallel import DistributedDataParallel

EOT = 256


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from bytes to printable characters (a published constant table)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


def write_byte_tokenizer(directory: str) -> None:
    table = bytes_to_unicode()
    vocab = {table[b]: b for b in range(256)}
    vocab["<|endoftext|>"] = EOT
    with open(os.path.join(directory, "vocab.json"), "w", encoding="utf-8") as f:
        json.dump(vocab, f, ensure_ascii=False)
    with open(os.path.join(directory, "merges.txt"), "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n")


def load_corpus(max_bytes: int) -> tuple[np.ndarray, np.ndarray]:
    """(train, held-out) byte streams; files split 95/5 by a hash of their path, EOT between files."""
    root = sysconfig.get_paths()["stdlib"]
    files = sorted(
        f
        for f in glob.glob(os.path.join(root, "**", "*.py"), recursive=True)
        if "site-packages" not in f and os.sep + "test" not in f[len(root) :]
    )
    train: list[bytes] = []
    held: list[bytes] = []
    total = 0
    for path in files:
        with open(path, "rb") as fh:
            data = fh.read()
        rel = os.path.relpath(path, root)
        (held if hashlib.sha1(rel.encode()).digest()[0] < 13 else train).append(data)
        total += len(data)
        if total >= max_bytes:
            break

    def join(parts: list[bytes]) -> np.ndarray:
        if not parts:
            return np.zeros(0, dtype=np.int64)
        out = []
        for p in parts:
            out.append(np.frombuffer(p, dtype=np.uint8).astype(np.int64))
            out.append(np.array([EOT], dtype=np.int64))
        return np.concatenate(out)

    return join(train), join(held)


def corpus_problem(train: np.ndarray, held: np.ndarray, context: int, corpus_mb: float) -> str | None:
    """Why the corpus cannot be used with this context (None if it can): each split must hold
    more than ``context + 1`` tokens, as every batch row is ``context + 1`` consecutive ones."""
    need = context + 1
    for name, data in (("held-out", held), ("training", train)):
        if len(data) <= need:
            return (
                f"the corpus is too small for its {name} split: {len(data):,} bytes, but --context {context} "
                f"needs more than {need:,} (the held-out split is about 5% of the files); raise --corpus-mb "
                f"(now {corpus_mb:g}) or lower --context"
            )
    return None


def batch(data: np.ndarray, batch_size: int, ctx: int, rng: np.random.Generator) -> tuple[kael.Tensor, kael.Tensor]:
    starts = rng.integers(0, len(data) - ctx - 1, size=batch_size)
    x = np.stack([data[s : s + ctx] for s in starts])
    y = np.stack([data[s + 1 : s + ctx + 1] for s in starts])
    return kael.from_numpy(x), kael.from_numpy(y)


class Windows:
    """The training stream as a dataset: window i is tokens [i*ctx, i*ctx + ctx + 1), as (x, y)."""

    def __init__(self, data: np.ndarray, ctx: int) -> None:
        self.data, self.ctx = data, ctx

    def __len__(self) -> int:
        return (len(self.data) - 1) // self.ctx

    def __getitem__(self, i: int) -> tuple[kael.Tensor, kael.Tensor]:
        x, y = self.__getitems__([i])
        return x[0], y[0]

    def __getitems__(self, indices: Any) -> tuple[kael.Tensor, kael.Tensor]:
        starts = np.asarray(indices, dtype=np.int64) * self.ctx
        rows = np.stack([self.data[s : s + self.ctx + 1] for s in starts])
        return kael.from_numpy(np.ascontiguousarray(rows[:, :-1])), kael.from_numpy(np.ascontiguousarray(rows[:, 1:]))


def sharded_batches(data: np.ndarray, batch_size: int, ctx: int, seed: int) -> Any:
    """This rank's batches, epoch after epoch: a DistributedSampler over the stream's windows."""
    windows = Windows(data, ctx)
    sampler = DistributedSampler(windows, shuffle=True, seed=seed)
    loader = DataLoader(windows, batch_size=batch_size, sampler=sampler, drop_last=True)
    if len(loader) == 0:
        raise SystemExit(
            f"error: {len(windows)} training windows of --context {ctx} give rank {dist.rank()} no full batch of "
            f"--batch-size {batch_size}; raise --corpus-mb or lower --batch-size"
        )
    epoch = 0
    while True:
        sampler.set_epoch(epoch)
        yield from loader
        epoch += 1


def loss_of(model: Any, x: kael.Tensor, y: kael.Tensor) -> kael.Tensor:
    logits = model(x)
    b, t, v = logits.shape
    return nn.functional.cross_entropy(logits.reshape(b * t, v), y.reshape(b * t))


def evaluate(model: GPT, data: np.ndarray, batches: int, batch_size: int, ctx: int) -> float:
    model.eval()
    rng = np.random.default_rng(1234)
    total = 0.0
    with kael.no_grad():
        for _ in range(batches):
            x, y = batch(data, batch_size, ctx, rng)
            total += float(loss_of(model, x, y).item())
    model.train()
    return total / batches


def save(model: GPT, opt: Any, state: dict[str, Any], out: str) -> None:
    os.makedirs(out, exist_ok=True)
    save_pretrained(model, out)
    write_byte_tokenizer(out)
    tensors = {}
    for i, st in enumerate(opt.state_dict()["state"].values()):
        for k, v in st.items():
            if isinstance(v, kael.Tensor):
                tensors[f"{i}.{k}"] = v
    kael.save_safetensors(tensors, os.path.join(out, "optimizer.safetensors"))
    tmp = os.path.join(out, "trainer.json.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(state, f, indent=1)
    os.replace(tmp, os.path.join(out, "trainer.json"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="kael-tiny", help="checkpoint directory")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--dimension", type=int, default=192)
    p.add_argument("--context", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument(
        "--steps", type=int, default=None, help="stop after this many steps (the progress bar then counts steps)"
    )
    p.add_argument("--minutes", type=float, default=30.0, help="stop after this much training time")
    p.add_argument("--corpus-mb", type=float, default=12.0, help="bytes of stdlib source to read")
    p.add_argument("--eval-every", type=int, default=200)
    p.add_argument("--eval-batches", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--resume", action="store_true", help="continue from the checkpoint in --out")
    p.add_argument(
        "--distributed", action="store_true", help="data-parallel over MPI: run under mpiexec -n N (rank 0 saves)"
    )
    args = p.parse_args(argv)

    if args.steps is not None and args.steps < 1:
        p.error(f"--steps must be at least 1, got {args.steps}")
    if args.distributed:
        dist.init()
    lead = dist.rank() == 0  # logs, evaluates and saves
    log = sys.stderr if lead else io.StringIO()  # the other ranks are quiet
    train, held = load_corpus(int(args.corpus_mb * 1e6))
    print(f"corpus: {len(train):,} training bytes, {len(held):,} held-out bytes", file=log)
    problem = corpus_problem(train, held, args.context, args.corpus_mb)
    if problem is not None:
        print(f"error: {problem}", file=log)
        return 2
    kael.manual_seed(args.seed)
    state: dict[str, Any] = {"step": 0, "seconds": 0.0, "tokens": 0, "history": []}
    if args.resume:
        model = GPT.from_pretrained(args.out)
        with open(os.path.join(args.out, "trainer.json"), encoding="utf-8") as f:
            state = json.load(f)
    else:
        model = GPT(
            vocab_size=EOT + 1,
            max_positions=args.context,
            layers=args.layers,
            heads=args.heads,
            dimension=args.dimension,
        )
    model.train()
    net: Any = DistributedDataParallel(model) if args.distributed else model  # the same weights on every rank
    params = list(model.parameters())
    decay = [q for q in params if q.ndim >= 2]
    no_decay = [q for q in params if q.ndim < 2]
    opt = optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr,
        betas=(0.9, 0.95),
    )
    if args.resume and os.path.exists(os.path.join(args.out, "optimizer.safetensors")):
        saved = kael.load_safetensors(os.path.join(args.out, "optimizer.safetensors"))
        sd = opt.state_dict()
        for i, key in enumerate(list(sd["state"].keys()) or range(len(params))):
            sd["state"][key] = {k.split(".", 1)[1]: v for k, v in saved.items() if k.split(".", 1)[0] == str(i)}
            sd["state"][key]["step"] = state["step"]
        opt.load_state_dict(sd)
    n_params = sum(q.numel() for q in params)
    print(f"model: {n_params:,} parameters" + (f", {dist.world_size()} ranks" if args.distributed else ""), file=log)
    warmup = 200
    budget = args.minutes * 60
    rng = np.random.default_rng(args.seed + state["step"])
    tokens_per_step = args.batch_size * args.context * dist.world_size()
    shards = (
        sharded_batches(train, args.batch_size, args.context, args.seed + state["step"]) if args.distributed else None
    )
    clock = kael.zeros(1, dtype=kael.float64)
    start = time.perf_counter() - state["seconds"]
    from tqdm import tqdm

    # With --steps the bar counts steps; otherwise seconds of the --minutes budget.
    by_steps = args.steps is not None
    bar = tqdm(
        total=args.steps if by_steps else int(budget),
        unit="step" if by_steps else "s",
        file=log,
        disable=not lead,
        initial=state["step"] if by_steps else int(state["seconds"]),
        mininterval=2.0,
        bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt}"
        + (" steps" if by_steps else "s")
        + " [{elapsed}<{remaining}]{postfix}",
    )
    step = state["step"]
    last_step = args.steps if by_steps else math.inf
    while step < last_step:
        elapsed = time.perf_counter() - start
        if args.distributed:  # rank 0's clock, so every rank takes the same lr and stops at the same step
            clock.fill_(elapsed)
            elapsed = float(dist.broadcast(clock, src=0).item())
        if elapsed >= budget:
            break
        frac = min(1.0, elapsed / budget)
        lr = args.lr * min(1.0, (step + 1) / warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        for g in opt.param_groups:
            g["lr"] = lr
        x, y = next(shards) if shards is not None else batch(train, args.batch_size, args.context, rng)
        loss = loss_of(net, x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        step += 1
        state["tokens"] += tokens_per_step
        now = time.perf_counter() - start
        bar.set_postfix(
            step=step,
            loss=f"{float(loss.item()):.3f}",
            tok_s=f"{state['tokens'] / max(now, 1e-9):,.0f}",
            lr=f"{lr:.2e}",
            refresh=False,
        )
        bar.update(1 if by_steps else int(min(now, budget)) - bar.n)
        if step % args.eval_every == 0 and lead:
            ev = evaluate(model, held, args.eval_batches, args.batch_size, args.context)
            state["history"].append({"step": step, "seconds": round(now, 1), "held_out_loss": round(ev, 4)})
            bar.write(f"step {step}: held-out loss {ev:.4f} ({ev / math.log(2):.3f} bits/byte)")
            state.update(step=step, seconds=now)
            save(model, opt, state, args.out)
    bar.close()
    now = time.perf_counter() - start
    if not lead:
        dist.barrier()  # until rank 0 has evaluated and saved
        return 0
    ev = evaluate(model, held, args.eval_batches * 2, args.batch_size, args.context)
    state.update(
        step=step,
        seconds=now,
        held_out_loss=ev,
        parameters=n_params,
        config={
            "layers": args.layers,
            "heads": args.heads,
            "dimension": args.dimension,
            "context": args.context,
            "batch_size": args.batch_size,
        },
    )
    save(model, opt, state, args.out)
    print(
        json.dumps(
            {
                "steps": step,
                "seconds": round(now, 1),
                "held_out_loss": round(ev, 4),
                "bits_per_byte": round(ev / math.log(2), 4),
                "parameters": n_params,
            }
        )
    )
    if args.distributed:
        dist.barrier()
    return 0


if __name__ == "__main__":
    sys.exit(main())
