"""A SmolLM2-135M-shaped Llama end to end: load, prefill and greedy decode with kael, against transformers.

The script builds a ``transformers.LlamaForCausalLM`` with SmolLM2-135M's shape (vocab
49152, 30 layers, hidden 576, intermediate 1536, 9 heads, 3 key/value heads, tied
embeddings, rope_theta 100000) and random weights (transformers' N(0, 0.02) init; nothing
is downloaded), saves it to a temporary directory, then measures, in one run, printing JSON:

* load time of ``LlamaForCausalLM.from_pretrained`` copying the weights and memory-mapping them;
* prefill time of a 512-token prompt into the KV cache (logits of the last position);
* greedy decode tokens/s for a 16-token prompt and 128 new tokens, at 1 and 2 threads
  (time from the first new token to the last, so the prefill is not counted; the total
  including the prefill is reported too);
* the same on transformers (same weights, ``torch.set_num_threads(n)``): a 512-token
  forward pass with its cache as the prefill, and ``model.generate(do_sample=False)``
  with its KV cache for the decode (a streamer stamps each token), and whether both
  decode the same tokens;
* the milliseconds per decode step spent in Python, outside the kernels (the same
  decode with every kernel replaced by a no-op), and which decode step ran.

Each thread count runs in a fresh worker process with ``KAEL_NUM_THREADS``,
``OMP_NUM_THREADS`` and ``OPENBLAS_NUM_THREADS`` set, as ``benchmarks/gpt2.py`` does.

    python benchmarks/llama.py [--threads 1 2] [--new-tokens 128] [--repeats 3] [--keep DIR]
                               [--backend NAME] [--layers N]
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

ROOT = Path(__file__).resolve().parent.parent
PROMPT_TOKENS, PREFILL_TOKENS = 16, 512
SMOLLM2_135M: dict[str, Any] = {
    "vocab_size": 49152,
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5,
    "rope_theta": 100000.0,
    "tie_word_embeddings": True,
    "bos_token_id": 0,
    "eos_token_id": 0,
}


def write_checkpoint(directory: Path, layers: int, seed: int = 0) -> float:
    """A SmolLM2-135M-shaped LlamaForCausalLM with random weights, saved by transformers; returns seconds."""
    import torch
    import transformers

    start = time.perf_counter()
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(**{**SMOLLM2_135M, "num_hidden_layers": layers})
    transformers.LlamaForCausalLM(cfg).save_pretrained(directory)
    return time.perf_counter() - start


# -- measurements (one worker process per thread count) ------------------------------------------


def _best(fn: Any, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def _decode_rate(stamps: list[float]) -> float:
    return (len(stamps) - 1) / (stamps[-1] - stamps[0])


class _Stamps:
    """A transformers streamer that records when each new token arrives (the first put is the prompt)."""

    def __init__(self) -> None:
        self.stamps: list[float] = []
        self.prompt_seen = False

    def put(self, value: Any) -> None:
        if not self.prompt_seen:
            self.prompt_seen = True
            return
        self.stamps.append(time.perf_counter())

    def end(self) -> None:
        pass


def worker(directory: Path, threads: int, new_tokens: int, repeats: int, backend: str | None) -> dict[str, Any]:
    import kael
    from kael.models import LlamaForCausalLM, decode_step

    if backend:
        kael.backends.use("cpu", backend)
    try:
        kael.set_num_threads(threads)
    except (AttributeError, ImportError):  # no threaded backend installed
        pass
    report: dict[str, Any] = {"threads": threads}
    report["load_copy_s"] = _best(lambda: LlamaForCausalLM.from_pretrained(directory), repeats)
    report["load_mmap_s"] = _best(lambda: LlamaForCausalLM.from_pretrained(directory, mmap=True), repeats)
    model = LlamaForCausalLM.from_pretrained(directory)
    report["kael_backend"] = kael.backends.current("cpu").name
    report["kael_decode_step"] = type(decode_step(model, model.new_cache(1, 8))).__name__
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

    import torch
    import transformers

    torch.set_num_threads(threads)
    hf = transformers.LlamaForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    long_ids, ids = torch.tensor([long_prompt]), torch.tensor([prompt])

    def hf_prefill() -> None:
        hf(long_ids, use_cache=True, logits_to_keep=1)

    def hf_decode() -> tuple[list[int], list[float]]:
        streamer = _Stamps()
        out = hf.generate(
            ids,
            max_new_tokens=new_tokens,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
            streamer=streamer,
        )
        return [int(t) for t in out[0, len(prompt) :]], streamer.stamps

    with torch.inference_mode():
        hf_prefill()
        report["torch_prefill_512_s"] = _best(hf_prefill, repeats)
        hf_decode()
        truns = [hf_decode() for _ in range(repeats)]
    report["torch_decode_tok_s"] = max(_decode_rate(r[1]) for r in truns)
    report["same_tokens_as_torch"] = truns[0][0] == kael_ids
    report["decode_vs_torch"] = report["decode_tok_s"] / report["torch_decode_tok_s"]
    report["prefill_vs_torch"] = report["torch_prefill_512_s"] / report["prefill_512_s"]
    report["torch_version"] = torch.__version__
    report["transformers_version"] = transformers.__version__
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--layers", type=int, default=SMOLLM2_135M["num_hidden_layers"], help="fewer for a quick run")
    ap.add_argument("--backend", default=None, help="the kael backend serving cpu (default: the highest priority)")
    ap.add_argument("--keep", type=Path, default=None, help="write the checkpoint here and keep it")
    ap.add_argument("--worker", type=Path, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker is not None:
        print(json.dumps(worker(args.worker, args.threads[0], args.new_tokens, args.repeats, args.backend)))
        return
    with tempfile.TemporaryDirectory(prefix="kael-llama-bench-") as tmp:
        directory = args.keep or Path(tmp)
        report: dict[str, Any] = {
            "model": f"SmolLM2-135M shape, {args.layers} layers (random weights, float32)",
            "prompt_tokens": PROMPT_TOKENS,
            "new_tokens": args.new_tokens,
            "prefill_tokens": PREFILL_TOKENS,
        }
        report["write_checkpoint_s"] = write_checkpoint(directory, args.layers)
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
            cmd = [sys.executable, __file__, "--worker", str(directory), "--threads", str(n)]
            cmd += ["--new-tokens", str(args.new_tokens), "--repeats", str(args.repeats)]
            if args.backend:
                cmd += ["--backend", args.backend]
            r = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
            if r.returncode != 0:
                raise SystemExit(f"worker with {n} thread(s) failed:\n{r.stderr}")
            runs.append(json.loads(r.stdout.strip().splitlines()[-1]))
        report["runs"] = runs
        keys = (
            "decode_tok_s",
            "torch_decode_tok_s",
            "decode_vs_torch",
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
