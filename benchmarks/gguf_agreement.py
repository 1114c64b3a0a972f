"""kael against llama.cpp on llama.cpp's own quantized files: logits and teacher-forced top-1, printing JSON.

Issue #28's agreement check. For each model (random weights, transformers' own init from a
config, nothing downloaded):

* ``smollm2``: a Llama with SmolLM2-135M's shape (30 layers, 576 wide, 9 heads, 3 K/V heads,
  FFN 1536, vocabulary 49152, tied embeddings, rope theta 100000), with a small trained
  byte-level BPE tokenizer (tests/core/hf_fixtures.py) padded to the vocabulary;
* ``gpt2``: GPT-2 small (12 layers, 768 wide, vocabulary 50257) with GPT-2's tokenizer
  (tests/data/gpt2-tokenizer),

kael writes the F32 GGUF file (``kael.models.save_gguf``), llama.cpp's ``llama-quantize``
makes each type from it (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K_M, Q4_K_S, Q4_K_M, Q5_K_M,
Q6_K, IQ4_XS; no importance matrix), and both engines compute the logits of every position
of one teacher-forced sequence (``--positions`` random token ids) on the same file: kael
with ``kael.models.load_gguf`` (float32 activations; ``--activations q8``: rounded to GGML's 8-bit
blocks as llama.cpp's CPU backend rounds them, KAEL_QUANT_ACTIVATIONS=q8), llama.cpp through llama-cpp-python
(``Llama(path, logits_all=True)``, whose dot products quantize activations to 8 bits).

Per type it prints: ``top1`` (the fraction of positions whose argmax agrees),
``max_abs`` and ``rms`` of the logit difference, ``rms_rel`` (rms of the difference over
the rms of llama.cpp's logits), the same figures for each engine against kael's F32 logits
(``quant_rms_rel``: how much the quantization itself moves the logits, the scale against
which the engines' disagreement is small), and the top-1 agreement on the positions whose
top-2 margin in llama.cpp's logits exceeds 4 times the measured rms difference
(``top1_clear``), and llama.cpp against itself: its logits with a float32 K/V cache against
those with its default float16 one (``llama_self_top1``, ``llama_self_rms_rel``). That last pair
is the noise floor: with 8-bit activations, a last-bit change anywhere flips some roundings,
and on these random checkpoints llama.cpp disagrees with itself about as much as with kael. ``--init`` scales the init's standard deviation: random weights at
transformers' 0.02 give nearly flat logits whose top-2 margins are below either engine's
rounding, so top-1 there measures ties more than agreement.

    python benchmarks/gguf_agreement.py [--models smollm2,gpt2] [--types q4_0,q4_k_m,...]
                                       [--positions 256] [--threads 2] [--init 0.02] [--keep DIR]
                                       [--activations f32|q8] [--kv f16|f32]
    python benchmarks/gguf_agreement.py --quick     # a 2-layer model, 3 types: a smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from _shapes import GPT2_SMALL, SMOLLM2_135M

ROOT = Path(__file__).resolve().parent.parent
TYPES = ["q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q2_k", "q3_k_m", "q4_k_s", "q4_k_m", "q5_k_m", "q6_k", "iq4_xs"]

__all__ = ["build", "compare", "main"]


def _tool(name: str) -> str:
    sys.path.insert(0, str(ROOT / "tests"))
    from llama_cpp_tools import find_tool

    path = find_tool(name)
    if path is None:
        raise SystemExit(f"{name} not found: run scripts/build_llama_cpp.sh --install (or set KAEL_LLAMA_CPP_BIN)")
    return path


def build(model: str, directory: Path, init: float, quick: bool) -> int:
    """A random checkpoint of `model` with its tokenizer in `directory`; returns the tokenizer's size."""
    import torch
    import transformers

    torch.manual_seed(0)
    if model == "gpt2":
        shape = dict(GPT2_SMALL, n_layer=2, n_embd=256, n_head=4) if quick else GPT2_SMALL
        cfg = transformers.GPT2Config(**shape, initializer_range=init, bos_token_id=50256, eos_token_id=50256)
        transformers.GPT2LMHeadModel(cfg).save_pretrained(directory)
        for f in (ROOT / "tests" / "data" / "gpt2-tokenizer").iterdir():
            shutil.copy(f, directory / f.name)
        return 50257
    sys.path.insert(0, str(ROOT / "tests" / "core"))
    from hf_fixtures import write_llama3

    write_llama3(directory)
    from kael.tokenizer import load_tokenizer

    n = load_tokenizer(directory).vocab_size
    shape = dict(SMOLLM2_135M, num_hidden_layers=2) if quick else SMOLLM2_135M
    cfg = transformers.LlamaConfig(**shape, initializer_range=init, bos_token_id=0, eos_token_id=1)
    transformers.LlamaForCausalLM(cfg).save_pretrained(directory)
    return int(n)


def _kael_logits(path: Path, ids: list[int]) -> np.ndarray:
    import kael
    from kael.models import load_gguf

    model, _ = load_gguf(path)
    with kael.no_grad():
        out = np.asarray(model(kael.tensor([ids]))._host()[0], np.float64)
    return out


def _llama_logits(path: Path, ids: list[int], threads: int, kv_f32: bool = False) -> np.ndarray:
    """llama.cpp's logits of every position; its K/V cache in float16 (its default), or float32 with `kv_f32`."""
    import llama_cpp

    kv = {"type_k": 0, "type_v": 0} if kv_f32 else {}  # GGML_TYPE_F32
    llm = llama_cpp.Llama(
        str(path), logits_all=True, verbose=False, n_ctx=len(ids) + 8, n_batch=len(ids), n_threads=threads,
        n_threads_batch=threads, **kv,
    )  # fmt: skip
    llm.eval(ids)
    out = np.array(llm.scores[: len(ids)], np.float64)
    llm.close()
    return out


def compare(ours: np.ndarray, theirs: np.ndarray, ref: np.ndarray, self_check: np.ndarray) -> dict[str, float]:
    """Agreement figures of two [T, V] logit arrays, of each against the float reference `ref`, and of
    llama.cpp against itself (`self_check`: its logits with a float32 K/V cache): the noise floor."""
    diff = ours - theirs
    rms = float(np.sqrt(np.mean(diff**2)))
    top2 = np.sort(theirs, axis=-1)[:, -2:]
    clear = (top2[:, 1] - top2[:, 0]) > 4 * rms
    agree = ours.argmax(-1) == theirs.argmax(-1)

    def rel(a: np.ndarray, b: np.ndarray) -> float:
        return float(np.sqrt(np.mean((a - b) ** 2)) / np.sqrt(np.mean(b**2)))

    return {
        "top1": float(agree.mean()),
        "top1_clear": float(agree[clear].mean()) if clear.any() else float("nan"),
        "clear_positions": int(clear.sum()),
        "max_abs": float(np.abs(diff).max()),
        "rms": rms,
        "rms_rel": rel(ours, theirs),
        "kael_quant_rms_rel": rel(ours, ref),
        "llama_quant_rms_rel": rel(theirs, ref),
        "kael_top1_vs_f32": float((ours.argmax(-1) == ref.argmax(-1)).mean()),
        "llama_top1_vs_f32": float((theirs.argmax(-1) == ref.argmax(-1)).mean()),
        "llama_self_top1": float((self_check.argmax(-1) == theirs.argmax(-1)).mean()),
        "llama_self_rms_rel": rel(self_check, theirs),
    }


def _compare_on(
    path: Path, ours: np.ndarray, ids: list[int], ref: np.ndarray, threads: int, kv_f32: bool = False
) -> dict[str, float]:
    """`compare` against llama.cpp with its float16 K/V cache (or float32 with `kv_f32`), the other as the self
    check."""
    theirs = _llama_logits(path, ids, threads, kv_f32=kv_f32)
    return compare(ours, theirs, ref, _llama_logits(path, ids, threads, kv_f32=not kv_f32))


def run_model(model: str, args: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    from kael.models import from_pretrained, save_gguf
    from kael.tokenizer import load_tokenizer

    d = scratch / model
    d.mkdir(parents=True, exist_ok=True)
    n_tok = build(model, d, args.init, args.quick)
    f32 = d / "f32.gguf"
    save_gguf(from_pretrained(d), f32, load_tokenizer(d))
    rng = np.random.default_rng(1)
    ids = [int(t) for t in rng.integers(2, n_tok, size=args.positions)]
    ref = _kael_logits(f32, ids)
    kv32 = args.kv == "f32"
    out: dict[str, Any] = {"f32": _compare_on(f32, ref, ids, ref, args.threads, kv32)}
    quantize = _tool("llama-quantize")
    for kind in args.types:
        path = d / f"{kind}.gguf"
        t0 = time.perf_counter()
        r = subprocess.run([quantize, str(f32), str(path), kind.upper(), str(args.threads)], capture_output=True)
        if r.returncode != 0:
            out[kind] = {"error": r.stderr.decode(errors="replace")[-500:]}
            continue
        took = time.perf_counter() - t0
        try:
            ours = _kael_logits(path, ids)
        except Exception as exc:  # a file kael refuses is a result to print, not a crash
            out[kind] = {"error": f"kael: {type(exc).__name__}: {exc}"}
            continue
        out[kind] = {**_compare_on(path, ours, ids, ref, args.threads, kv32), "quantize_s": round(took, 1)}
        path.unlink()
        print(json.dumps({"model": model, "type": kind, **out[kind]}), file=sys.stderr, flush=True)
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", default="smollm2,gpt2")
    p.add_argument("--types", default=",".join(TYPES))
    p.add_argument("--positions", type=int, default=256)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--init", type=float, default=0.02, help="the init's standard deviation (transformers: 0.02)")
    p.add_argument("--keep", type=Path, default=None, help="keep the checkpoints and files in this folder")
    p.add_argument("--quick", action="store_true", help="2-layer models, 3 types, 32 positions (a smoke run)")
    p.add_argument(
        "--activations", choices=["f32", "q8"], default="f32",
        help="kael's quantized_linear activations (KAEL_QUANT_ACTIVATIONS): q8 rounds them as llama.cpp does",
    )  # fmt: skip
    p.add_argument(
        "--kv", choices=["f16", "f32"], default="f16",
        help="llama.cpp's K/V cache type compared with (the other is its self check); kael's cache is float32",
    )  # fmt: skip
    args = p.parse_args(argv)
    os.environ["KAEL_QUANT_ACTIVATIONS"] = args.activations
    args.types = [t for t in args.types.split(",") if t]
    if args.quick:
        args.types, args.positions = ["q4_0", "q4_k_m", "iq4_xs"], 32
    with tempfile.TemporaryDirectory() as tmp:
        scratch = args.keep or Path(tmp)
        result = {
            "positions": args.positions,
            "threads": args.threads,
            "init": args.init,
            "activations": args.activations,
            "kv": args.kv,
            "models": {m: run_model(m, args, scratch) for m in args.models.split(",") if m},
        }
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
