"""GPT-2 small end to end: load, prefill and greedy decode with kael, against PyTorch (when installed).

The script writes a GPT-2 small checkpoint with random weights (N(0, 0.02), written by
kael's own ``save_pretrained``; nothing is downloaded) to a temporary directory, then
measures, in one run, printing JSON:

* load time of ``GPT.from_pretrained`` copying the weights and memory-mapping them;
* prefill time of a 512-token prompt into the KV cache (logits of the last position);
* greedy decode tokens/s for a 16-token prompt and 128 new tokens, at 1 and 2 threads
  (time from the first new token to the last, so the prefill is not counted; the total
  including the prefill is reported too);
* the same prefill and decode on a plain PyTorch GPT-2 with a KV cache over the same
  weights (written below; skipped without torch), and whether both decode the same tokens;
* the milliseconds per decode step spent in Python, outside the kernels (the same
  decode with every kernel replaced by a no-op);
* the BPE tokenizer's encode throughput in MB/s.

Each thread count runs in a fresh worker process with ``KAEL_NUM_THREADS``,
``OMP_NUM_THREADS`` and ``OPENBLAS_NUM_THREADS`` set, so NumPy's BLAS (the reference
backend's) honours it too, and ``kael.set_num_threads`` / ``torch.set_num_threads``
are called where they exist.

    python benchmarks/gpt2.py [--threads 1 2] [--new-tokens 128] [--repeats 3] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from llama import _best, _decode_rate

ROOT = Path(__file__).resolve().parent.parent
TOKENIZER = ROOT / "tests" / "data" / "gpt2-tokenizer"
PROMPT_TOKENS, PREFILL_TOKENS = 16, 512


# -- the checkpoint ----------------------------------------------------------------------------


def write_checkpoint(directory: Path, seed: int = 0) -> float:
    """A GPT-2 small with random weights, saved by kael; returns the seconds it took."""
    import kael
    from kael.models import GPT, save_pretrained

    start = time.perf_counter()
    model = GPT(init=False)  # kael's own init draws 124M normals slowly on the NumPy backend
    rng = np.random.default_rng(seed)
    with kael.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                values = np.zeros(p.shape, np.float32)
            elif ".ln_" in name or name.startswith("ln_"):
                values = np.ones(p.shape, np.float32)
            else:
                values = rng.standard_normal(p.shape, dtype=np.float32) * np.float32(0.02)
            p.copy_(kael.from_numpy(values))
    save_pretrained(model, directory)
    return time.perf_counter() - start


# -- PyTorch GPT-2 with a KV cache --------------------------------------------------------------


class TorchGPT2:
    """GPT-2 in plain PyTorch over a checkpoint's tensors (Conv1D weights [in, out], as Hugging Face)."""

    def __init__(self, torch: Any, weights: dict[str, Any], layers: int, heads: int) -> None:
        self.torch, self.w, self.layers, self.heads = torch, weights, layers, heads
        self.dim = weights["wte.weight"].shape[1]

    def new_cache(self, positions: int) -> list[Any]:
        d = self.dim // self.heads
        return [self.torch.zeros(2, 1, self.heads, positions, d) for _ in range(self.layers)]

    def step(self, ids: list[int], cache: list[Any], start: int) -> Any:
        """Logits of the last position for ids following ``start`` cached tokens."""
        torch, w, F = self.torch, self.w, self.torch.nn.functional
        t, c, h = len(ids), self.dim, self.heads
        x = w["wte.weight"][torch.tensor(ids)] + w["wpe.weight"][start : start + t]  # [T, C]
        for i in range(self.layers):
            p = f"h.{i}."
            a = F.layer_norm(x, (c,), w[p + "ln_1.weight"], w[p + "ln_1.bias"], 1e-5)
            qkv = torch.addmm(w[p + "attn.c_attn.bias"], a, w[p + "attn.c_attn.weight"])
            q, k, v = qkv.view(t, 3, h, c // h).permute(1, 2, 0, 3)  # each [H, T, D]
            cache[i][0, 0, :, start : start + t] = k
            cache[i][1, 0, :, start : start + t] = v
            keys, values = cache[i][0, 0, :, : start + t], cache[i][1, 0, :, : start + t]
            y = F.scaled_dot_product_attention(q, keys, values, is_causal=t > 1 and start == 0)
            x = x + torch.addmm(w[p + "attn.c_proj.bias"], y.transpose(0, 1).reshape(t, c), w[p + "attn.c_proj.weight"])
            a = F.layer_norm(x, (c,), w[p + "ln_2.weight"], w[p + "ln_2.bias"], 1e-5)
            a = F.gelu(torch.addmm(w[p + "mlp.c_fc.bias"], a, w[p + "mlp.c_fc.weight"]), approximate="tanh")
            x = x + torch.addmm(w[p + "mlp.c_proj.bias"], a, w[p + "mlp.c_proj.weight"])
        x = F.layer_norm(x[-1:], (c,), w["ln_f.weight"], w["ln_f.bias"], 1e-5)
        return (x @ w["wte.weight"].T)[0]

    def greedy(self, prompt: list[int], n: int) -> tuple[list[int], list[float]]:
        cache = self.new_cache(len(prompt) + n)
        logits = self.step(prompt, cache, 0)
        out, stamps = [], []
        for i in range(n):
            token = int(self.torch.argmax(logits))
            out.append(token)
            stamps.append(time.perf_counter())
            if i < n - 1:
                logits = self.step([token], cache, len(prompt) + i)
        return out, stamps


# -- measurements (one worker process per thread count) ------------------------------------------


def worker(directory: Path, threads: int, new_tokens: int, repeats: int) -> dict[str, Any]:
    import kael
    from kael.models import GPT

    try:
        kael.set_num_threads(threads)
    except (AttributeError, ImportError):  # no threaded backend installed
        pass
    report: dict[str, Any] = {"threads": threads}
    report["load_copy_s"] = _best(lambda: GPT.from_pretrained(directory), repeats)
    report["load_mmap_s"] = _best(lambda: GPT.from_pretrained(directory, mmap=True), repeats)
    model = GPT.from_pretrained(directory)
    report["kael_backend"] = kael.backends.current("cpu").name
    rng = np.random.default_rng(1)
    long_prompt = rng.integers(0, model.vocab_size, PREFILL_TOKENS).tolist()
    prompt = rng.integers(0, model.vocab_size, PROMPT_TOKENS).tolist()

    def prefill() -> None:
        with kael.no_grad():
            model(kael.tensor([long_prompt]), model.new_cache(max_positions=PREFILL_TOKENS), last_only=True)

    prefill()
    report["prefill_512_s"] = _best(prefill, repeats)

    def decode() -> tuple[list[int], list[float], float]:
        stamps: list[float] = []
        start = time.perf_counter()
        ids = model.generate(prompt, new_tokens, on_token=lambda t: stamps.append(time.perf_counter()))
        return ids, stamps, time.perf_counter() - start

    decode()  # warm-up
    runs = [decode() for _ in range(repeats)]
    kael_ids = runs[0][0]
    report["decode_tok_s"] = max(_decode_rate(r[1]) for r in runs)
    report["generate_total_tok_s"] = max(new_tokens / r[2] for r in runs)
    report["decode_python_ms_per_token"] = python_overhead_ms(model, prompt, new_tokens)
    try:
        import torch
    except ImportError:
        return report
    torch.set_num_threads(threads)
    w = {
        k[len("transformer.") :]: torch.from_numpy(v.numpy())
        for k, v in kael.load_safetensors(directory / "model.safetensors").items()
    }
    tm = TorchGPT2(torch, w, model.config.layers, model.config.heads)
    with torch.inference_mode():
        tm.step(long_prompt, tm.new_cache(PREFILL_TOKENS), 0)
        report["torch_prefill_512_s"] = _best(lambda: tm.step(long_prompt, tm.new_cache(PREFILL_TOKENS), 0), repeats)
        tm.greedy(prompt, new_tokens)
        truns = [tm.greedy(prompt, new_tokens) for _ in range(repeats)]
    report["torch_decode_tok_s"] = max(_decode_rate(r[1]) for r in truns)
    report["same_tokens_as_torch"] = truns[0][0] == kael_ids
    report["decode_vs_torch"] = report["decode_tok_s"] / report["torch_decode_tok_s"]
    report["torch_version"] = torch.__version__
    return report


def python_overhead_ms(model: Any, prompt: list[int], new_tokens: int) -> float:
    """Milliseconds per decode step spent outside the kernels: the same decode with every kernel a no-op."""
    from kael.backends import dispatch

    noop = lambda *args, **kwargs: None  # noqa: E731
    real = ("argmax", "amin", "amax")  # the id checks and greedy choice read their results
    dispatch.set_kernel_wrapper(lambda device, op, backend, kernel: kernel if op in real else noop)
    try:
        stamps: list[float] = []
        model.generate(prompt, new_tokens, on_token=lambda t: stamps.append(time.perf_counter()))
    finally:
        dispatch.set_kernel_wrapper(None)
    return 1e3 / _decode_rate(stamps)


def tokenizer_mb_s(repeats: int) -> dict[str, Any]:
    try:
        from kael.tokenizer import BpeTokenizer
    except ImportError:
        return {}
    tok = BpeTokenizer.from_files(TOKENIZER / "vocab.json", TOKENIZER / "merges.txt")
    lines = [json.loads(line)["text"] for line in (TOKENIZER / "cases.jsonl").open(encoding="utf-8")]
    text = "\n".join(lines * max(1, int(2e6 // len("\n".join(lines).encode()))))
    tok.encode(text)
    best = _best(lambda: tok.encode(text), repeats)
    return {"tokenizer_encode_mb_s": len(text.encode()) / 1e6 / best, "tokenizer_text_mb": len(text.encode()) / 1e6}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--keep", type=Path, default=None, help="write the checkpoint here and keep it")
    ap.add_argument("--worker", type=Path, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker is not None:
        print(json.dumps(worker(args.worker, args.threads[0], args.new_tokens, args.repeats)))
        return
    with tempfile.TemporaryDirectory(prefix="kael-gpt2-bench-") as tmp:
        directory = args.keep or Path(tmp)
        report: dict[str, Any] = {
            "model": "gpt2-small (random weights, float32)",
            "prompt_tokens": PROMPT_TOKENS,
            "new_tokens": args.new_tokens,
            "prefill_tokens": PREFILL_TOKENS,
        }
        report["write_checkpoint_s"] = write_checkpoint(directory)
        src = str(ROOT / "kael_core" / "src")
        runs = []
        for n in args.threads:
            env = dict(
                os.environ,
                KAEL_NUM_THREADS=str(n),
                OMP_NUM_THREADS=str(n),
                OPENBLAS_NUM_THREADS=str(n),
                MKL_NUM_THREADS=str(n),
                PYTHONPATH=os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH")) if p),
            )
            r = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--worker",
                    str(directory),
                    "--threads",
                    str(n),
                    "--new-tokens",
                    str(args.new_tokens),
                    "--repeats",
                    str(args.repeats),
                ],
                capture_output=True,
                text=True,
                env=env,
                check=False,
            )
            if r.returncode != 0:
                raise SystemExit(f"worker with {n} thread(s) failed:\n{r.stderr}")
            runs.append(json.loads(r.stdout.strip().splitlines()[-1]))
        report["runs"] = runs
        report.update(tokenizer_mb_s(args.repeats))
        keys = (
            "decode_tok_s",
            "torch_decode_tok_s",
            "decode_python_ms_per_token",
            "prefill_512_s",
            "torch_prefill_512_s",
            "load_copy_s",
            "load_mmap_s",
        )
        report["summary"] = {f"{r['threads']}t": {k: round(r[k], 4) for k in keys if k in r} for r in runs}
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
