"""The 2026 laptop families end to end: prefill and greedy decode with kael, against transformers, in one run.

For each model shape below the script builds the transformers model from its config with random
weights (transformers' initialisation; nothing is downloaded), saves it to a temporary directory,
loads it with ``kael.models.from_pretrained`` (the family registry, as a user would) and with
``transformers.AutoModelForCausalLM``, and measures, in a fresh worker process per thread count
(``KAEL_NUM_THREADS``, ``OMP_NUM_THREADS`` and ``torch.set_num_threads`` set alike), printing JSON:

* prefill: seconds for a 512-token prompt into the KV cache (logits of the last position), and the
  tokens/s that makes;
* decode: greedy tokens/s for a 16-token prompt and ``--new-tokens`` new tokens, from the first new
  token to the last (transformers: ``generate(do_sample=False)`` with its cache, a streamer stamping
  each token), and whether both decode the same tokens;
* the ratios kael/transformers (the issue's floor: decode as fast as PyTorch; the goal: 2x).

Shapes (``--models``; ``--layers N`` cuts every model to N layers for a quick run):

* ``qwen3-0.6b``: Qwen3-0.6B's shape (28 layers, hidden 1024, 16 heads, 8 kv heads, head_dim 128);
* ``gemma3-1b``: Gemma-3-1B's text model (26 layers, hidden 1152, 4 heads, 1 kv head, head_dim 256,
  sliding window 512 on five layers of six);
* ``qwen3-moe-small``: Qwen3-30B-A3B's design scaled down to fit this machine (8 layers, hidden 1024,
  64 experts of 384, 8 per token).

A family kael does not serve (or transformers does not know) is reported as skipped with the reason.

    python benchmarks/families.py [--models qwen3-0.6b gemma3-1b qwen3-moe-small] [--threads 2]
                                  [--new-tokens 128] [--repeats 1] [--layers N]
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
from llama import _best, _decode_rate, _Stamps

__all__ = ["MODELS", "write_checkpoint", "worker"]

ROOT = Path(__file__).resolve().parent.parent
PROMPT_TOKENS, PREFILL_TOKENS = 16, 512

MODELS: dict[str, tuple[str, dict[str, Any]]] = {
    "qwen3-0.6b": (
        "Qwen3Config",
        {
            "vocab_size": 151936,
            "hidden_size": 1024,
            "intermediate_size": 3072,
            "num_hidden_layers": 28,
            "num_attention_heads": 16,
            "num_key_value_heads": 8,
            "head_dim": 128,
            "max_position_embeddings": 40960,
            "rope_theta": 1000000.0,
            "rms_norm_eps": 1e-6,
            "tie_word_embeddings": True,
        },
    ),
    "gemma3-1b": (
        "Gemma3TextConfig",
        {
            "vocab_size": 262144,
            "hidden_size": 1152,
            "intermediate_size": 6912,
            "num_hidden_layers": 26,
            "num_attention_heads": 4,
            "num_key_value_heads": 1,
            "head_dim": 256,
            "query_pre_attn_scalar": 256,
            "sliding_window": 512,
            "max_position_embeddings": 32768,
            "rms_norm_eps": 1e-6,
        },
    ),
    "qwen3-moe-small": (
        "Qwen3MoeConfig",
        {
            "vocab_size": 151936,
            "hidden_size": 1024,
            "intermediate_size": 3072,
            "moe_intermediate_size": 384,
            "num_hidden_layers": 8,
            "num_attention_heads": 16,
            "num_key_value_heads": 4,
            "head_dim": 128,
            "num_experts": 64,
            "num_experts_per_tok": 8,
            "norm_topk_prob": True,
            "max_position_embeddings": 40960,
            "rope_theta": 1000000.0,
            "rms_norm_eps": 1e-6,
            "tie_word_embeddings": False,
        },
    ),
}


def write_checkpoint(name: str, directory: Path, layers: int | None, seed: int = 0) -> float:
    """The model ``name`` with random weights, saved by transformers to ``directory``; returns seconds."""
    import torch
    import transformers

    config_class, kwargs = MODELS[name]
    if layers is not None:
        kwargs = {**kwargs, "num_hidden_layers": layers}
    start = time.perf_counter()
    torch.manual_seed(seed)
    config = getattr(transformers, config_class)(**kwargs)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(directory)
    return time.perf_counter() - start


def worker(directory: Path, threads: int, new_tokens: int, repeats: int) -> dict[str, Any]:
    """One thread count: kael's and transformers' prefill and decode of the checkpoint in ``directory``."""
    import kael
    from kael.models import decode_step, from_pretrained

    kael.set_num_threads(threads)
    report: dict[str, Any] = {"threads": threads}
    model = from_pretrained(directory)
    report["kael_class"] = type(model).__name__
    report["kael_decode_step"] = type(decode_step(model, model.new_cache(1, 8))).__name__
    rng = np.random.default_rng(1)
    long_prompt = rng.integers(0, model.vocab_size, PREFILL_TOKENS).tolist()
    prompt = rng.integers(0, model.vocab_size, PROMPT_TOKENS).tolist()

    def prefill() -> None:
        with kael.no_grad():
            model(kael.tensor([long_prompt]), model.new_cache(max_positions=PREFILL_TOKENS), last_only=True)

    prefill()
    report["prefill_s"] = _best(prefill, repeats)

    def decode() -> tuple[list[int], list[float]]:
        stamps: list[float] = []
        ids = model.generate(prompt, new_tokens, on_token=lambda t: stamps.append(time.perf_counter()))
        return ids, stamps

    runs = [decode() for _ in range(repeats)]
    report["decode_tok_s"] = max(_decode_rate(r[1]) for r in runs)

    import torch
    import transformers

    torch.set_num_threads(threads)
    hf = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    long_ids, ids = torch.tensor([long_prompt]), torch.tensor([prompt])

    def hf_prefill() -> None:
        hf(long_ids, use_cache=True, logits_to_keep=1)

    def hf_decode() -> tuple[list[int], list[float]]:
        streamer = _Stamps()
        out = hf.generate(
            ids, max_new_tokens=new_tokens, do_sample=False, eos_token_id=None, pad_token_id=0, streamer=streamer
        )
        return [int(t) for t in out[0, len(prompt) :]], streamer.stamps

    with torch.inference_mode():
        hf_prefill()
        report["torch_prefill_s"] = _best(hf_prefill, repeats)
        truns = [hf_decode() for _ in range(repeats)]
    report["torch_decode_tok_s"] = max(_decode_rate(r[1]) for r in truns)
    report["same_tokens_as_torch"] = truns[0][0] == runs[0][0]
    report["prefill_tok_s"] = PREFILL_TOKENS / report["prefill_s"]
    report["torch_prefill_tok_s"] = PREFILL_TOKENS / report["torch_prefill_s"]
    report["decode_vs_torch"] = report["decode_tok_s"] / report["torch_decode_tok_s"]
    report["prefill_vs_torch"] = report["torch_prefill_s"] / report["prefill_s"]
    return report


def _run_model(name: str, args: argparse.Namespace) -> dict[str, Any]:
    report: dict[str, Any] = {"config": MODELS[name][0], "layers": args.layers or MODELS[name][1]["num_hidden_layers"]}
    with tempfile.TemporaryDirectory(prefix=f"kael-families-{name}-") as tmp:
        try:
            report["write_checkpoint_s"] = write_checkpoint(name, Path(tmp), args.layers)
        except (AttributeError, ValueError, TypeError) as exc:
            return {**report, "skipped": f"transformers cannot build it: {exc}"}
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
            cmd = [sys.executable, __file__, "--worker", tmp, "--threads", str(n)]
            cmd += ["--new-tokens", str(args.new_tokens), "--repeats", str(args.repeats)]
            r = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
            if r.returncode != 0:
                tail = r.stderr.strip().splitlines()[-1:] or ["(no output)"]
                return {**report, "skipped": f"the worker with {n} thread(s) failed: {tail[0]}"}
            runs.append(json.loads(r.stdout.strip().splitlines()[-1]))
    keys = ("decode_tok_s", "torch_decode_tok_s", "decode_vs_torch", "prefill_tok_s", "torch_prefill_tok_s")
    report["runs"] = runs
    report["summary"] = {f"{r['threads']}t": {k: round(r[k], 3) for k in keys} for r in runs}
    return report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", choices=sorted(MODELS), default=list(MODELS))
    ap.add_argument("--threads", type=int, nargs="+", default=[2])
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--layers", type=int, default=None, help="cut every model to this many layers (a quick run)")
    ap.add_argument("--worker", type=Path, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker is not None:
        print(json.dumps(worker(args.worker, args.threads[0], args.new_tokens, args.repeats)))
        return
    report: dict[str, Any] = {
        "prompt_tokens": PROMPT_TOKENS,
        "prefill_tokens": PREFILL_TOKENS,
        "new_tokens": args.new_tokens,
        "dtype": "float32 (random weights)",
        "models": {name: _run_model(name, args) for name in args.models},
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
