"""kael against llama.cpp on the same GGUF files, as each one's users run it: decode, prefill, roofline (JSON).

For each model (random weights from transformers' own init, nothing downloaded):

* ``gpt2``: GPT-2 small (124M: 12 layers, 768 wide, vocabulary 50257, the GPT-2 tokenizer from
  ``tests/data``);
* ``smollm2``: a Llama with SmolLM2-135M's shape (30 layers, 576 wide, 9 heads, 3 K/V heads, FFN
  1536, vocabulary 49152, tied embeddings; a small trained tokenizer padded to the vocabulary),

kael writes the F32, BF16 and F16 files (``kael.models.save_gguf``) and llama.cpp's
``llama-quantize`` makes Q8_0, Q4_0 and Q4_K_M from the F32 one, as users get them
(``--quantizer kael``: kael writes those too, with the same bytes; ``--formats`` may also name
any other type of ``kael.quant.formats.MIXES``: q4_1, q5_0, q5_1, q3_k_m, q5_k_m, q6_k, iq4_xs, ...). Then, per format and thread
count, in one run:

* kael (``kael.models.load_gguf``), each measurement in a fresh worker process with
  ``KAEL_NUM_THREADS`` set: greedy decode of ``--tokens`` (128) new tokens after a 16-token
  prompt (time from the first new token to the last), and prefill of a ``--prompt`` (512) token
  prompt into the KV cache, best of ``--repeats``;
* llama.cpp through its ``llama-bench`` binary (``-p 512 -n 128 -t T -r R -o json``: pp512 and
  tg128, the mean over the repetitions), with the build and CPU it reports;
* memory: kael's resident memory after loading, at the end and at its peak over the whole run, each less
  the worker's before loading (``kael_loaded_mb``, ``kael_end_mb``, ``kael_run_mb``: the model, the
  repacked copies decode makes, the caches and buffers; compare ``file_mb``), and llama-bench's peak
  (``llama_bench_peak_rss_mb``: the whole process, the mapped file's pages it touched included);
* the memory roofline: the weight bytes one decoded token reads (every tensor of the file but
  the token table's unused rows when the head is a separate tensor, and the position table),
  times tok/s, over the read bandwidth measured here at the same thread count for a working set
  of that size (NumPy reductions, a float32 sum and a uint32 max, of an array of that many bytes
  split across the threads, read again and again: the best of 5 of the faster one). A file that
  fits in the last-level cache (``llc_bytes``; some hosts have 300 MiB of L3) is read from there
  at each token, by kael and llama.cpp alike, so its roofline is the cache's, not DRAM's;
  ``bandwidth_gb_s`` is the DRAM figure (a 1 GiB array) for reference;

plus kael's float32 path from the safetensors checkpoint as the floor and ``kael.cpu.isa()``.

    python benchmarks/quantized.py [--models gpt2,smollm2] [--formats f32,bf16,f16,q8_0,q4_0,q4_k_m]
                                   [--threads 1,2] [--tokens 128] [--prompt 512] [--repeats 2]
                                   [--quantizer llama.cpp|kael] [--keep DIR] [--quick]

``--quick`` is a smoke run (2-layer models, 8 new tokens, a 32-token prefill, one repeat).
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
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from _llama_cpp_bench import find_tool, llama_bench, llama_quantize
from _shapes import GPT2_SMALL, SMOLLM2_135M
from kael.quant.formats import MIXES

ROOT = Path(__file__).resolve().parent.parent
TOKENIZER = ROOT / "tests" / "data" / "gpt2-tokenizer"
FORMATS = ("f32", "bf16", "f16", "q8_0", "q4_0", "q4_k_m")
#: what --formats may name: the default FORMATS (issue 29's), then every other llama-quantize type of kael's registry
ALLOWED_FORMATS = (*FORMATS, *(m for m in MIXES if m not in FORMATS))
MODELS = ("gpt2", "smollm2")
FLOAT_FORMATS = ("f32", "bf16", "f16")
PROMPT_TOKENS = 16
WARMUP_TOKENS = 4  # the decode warm-up before the timed runs

__all__ = ["main", "summarize", "bandwidth", "bytes_per_token"]


# -- the checkpoints and their GGUF files ---------------------------------------------------------


def write_checkpoint(model: str, directory: Path, quick: bool) -> None:
    """A random ``model`` checkpoint with its tokenizer in ``directory`` (transformers' init, seed 0)."""
    import torch
    import transformers

    torch.manual_seed(0)
    if model == "gpt2":
        shape = dict(GPT2_SMALL, n_layer=2, n_embd=64, n_head=2, n_positions=128) if quick else GPT2_SMALL
        # n_ctx: transformers no longer writes it, llama.cpp's GPT-2 converter still reads it
        cfg = transformers.GPT2Config(**shape, n_ctx=shape["n_positions"], bos_token_id=50256, eos_token_id=50256)
        transformers.GPT2LMHeadModel(cfg).save_pretrained(directory)
        for name in ("vocab.json", "merges.txt"):
            shutil.copy(TOKENIZER / name, directory / name)
        return
    sys.path.insert(0, str(ROOT / "tests" / "core"))
    from hf_fixtures import write_llama3

    write_llama3(directory)
    shape = dict(SMOLLM2_135M, num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=1024) if quick else SMOLLM2_135M  # fmt: skip
    transformers.LlamaForCausalLM(transformers.LlamaConfig(**shape, bos_token_id=0, eos_token_id=1)).save_pretrained(
        directory
    )


def export(hf_dir: Path, out_dir: Path, name: str, formats: list[str], quantizer: str, threads: int) -> dict[str, Path]:
    """One GGUF file per format: the float ones by kael's writer, the block ones by ``quantizer``."""
    from kael.models import from_pretrained, save_gguf
    from kael.tokenizer import load_tokenizer

    model, tok = from_pretrained(hf_dir), load_tokenizer(hf_dir)
    paths = {}
    f32 = out_dir / f"{name}-f32.gguf"
    save_gguf(model, f32, tok)
    for fmt in formats:
        paths[fmt] = out_dir / f"{name}-{fmt}.gguf"
        if fmt == "f32":
            continue
        if fmt in FLOAT_FORMATS or quantizer == "kael":
            save_gguf(model, paths[fmt], tok, weights=fmt)
        else:
            llama_quantize(f32, paths[fmt], fmt, threads)
    return paths


def bytes_per_token(path: Path) -> int:
    """The weight bytes one decoded token reads from a GGUF file: every tensor, but one row of the token table
    when the head is a separate tensor (``output.weight``) and one row of a position table."""
    import kael

    with kael.io.read_gguf(path) as f:
        total = 0
        for name, t in f.tensors.items():
            n = int(np.asarray(t.data).nbytes)
            if name == "position_embd.weight" or (name == "token_embd.weight" and "output.weight" in f.tensors):
                n //= max(1, t.shape[0])
            total += n
    return total


def bandwidth(threads: int, gib: float = 1.0, repeats: int = 5) -> float:
    """Read bandwidth (bytes/s) at ``threads`` threads of a ``gib`` GiB working set, read again and again: the
    best of ``repeats`` passes of the faster of two NumPy reductions (a float32 sum, which some NumPy builds
    run below the memory's speed, and a uint32 max), the array split in ``threads`` parts (NumPy releases
    the GIL while it reduces)."""
    a = np.ones(max(threads * 1024, int(gib * 2**30) // 4), np.float32)
    parts = np.array_split(a, threads)
    best = float("inf")
    with ThreadPoolExecutor(threads) as pool:
        for reduce in (np.sum, lambda part: np.max(part.view(np.uint32))):
            list(pool.map(reduce, parts))  # warm: the pages touched, a cache-sized set in the cache
            for _ in range(repeats):
                start = time.perf_counter()
                list(pool.map(reduce, parts))
                best = min(best, time.perf_counter() - start)
    return a.nbytes / best


def llc_bytes() -> int | None:
    """The size of the largest CPU cache Linux reports (sysfs), or None where it does not."""
    sizes = []
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            text = (index / "size").read_text().strip()
        except OSError:
            continue
        unit = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
        digits = text[:-1] if text[-1:] in "KMG" else text
        if digits.isdigit():
            sizes.append(int(digits) * unit)
    return max(sizes) if sizes else None


# -- kael's measurements (one worker process per file and thread count) ---------------------------


def _best(fn: Any, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def _decode_rate(stamps: list[float]) -> float:
    return (len(stamps) - 1) / (stamps[-1] - stamps[0]) if len(stamps) > 1 else float("nan")


def worker_kael(path: Path, threads: int, tokens: int, prefill: int, repeats: int) -> dict[str, Any]:
    """kael on a GGUF file (load_gguf) or, for a directory, the float32 safetensors checkpoint."""
    import kael
    from kael.models import from_pretrained, load_gguf

    report: dict[str, Any] = {"engine": "kael", "threads": threads, "base_rss_mb": _rss_mb("VmRSS")}
    start = time.perf_counter()
    model = from_pretrained(path) if path.is_dir() else load_gguf(path)[0]
    report["load_s"] = time.perf_counter() - start
    report["loaded_rss_mb"] = _rss_mb("VmRSS")
    report["weights_scheme"] = model.weights_scheme
    rng = np.random.default_rng(1)
    prompt = rng.integers(0, model.vocab_size, PROMPT_TOKENS).tolist()
    long_prompt = rng.integers(0, model.vocab_size, prefill).tolist()

    def run_prefill() -> None:
        with kael.no_grad():
            model(kael.tensor([long_prompt]), model.new_cache(max_positions=prefill), last_only=True)

    run_prefill()
    report["prefill_tok_s"] = prefill / _best(run_prefill, repeats)

    def decode(n: int = tokens) -> list[float]:
        stamps: list[float] = []
        model.generate(prompt, n, on_token=lambda t: stamps.append(time.perf_counter()))
        return stamps

    decode(WARMUP_TOKENS)  # first-call allocations and caches
    report["decode_tok_s"] = max(_decode_rate(decode()) for _ in range(repeats))
    report["end_rss_mb"] = _rss_mb("VmRSS")
    report["peak_rss_mb"] = _rss_mb("VmHWM")
    return report


def _rss_mb(field: str) -> float | None:
    """This process's resident memory (``VmRSS``) or its peak (``VmHWM``) in MB, from /proc (None elsewhere)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return round(int(line.split()[1]) * 1024 / 1e6, 1)
    except OSError:
        pass
    return None


def _run_kael(path: Path, threads: int, args: argparse.Namespace) -> dict[str, Any]:
    env = dict(os.environ, KAEL_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads))
    cmd = [sys.executable, __file__, "--worker", str(path), "--threads", str(threads)]
    cmd += ["--tokens", str(args.tokens), "--prompt", str(args.prompt), "--repeats", str(args.repeats)]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if r.returncode != 0:
        return {"engine": "kael", "threads": threads, "error": r.stderr.strip()[-2000:] or f"exit {r.returncode}"}
    return dict(json.loads(r.stdout.strip().splitlines()[-1]))


def system_info() -> dict[str, Any]:
    """The instruction set kael's CPU kernels picked and the llama.cpp binaries used."""
    import kael

    info: dict[str, Any] = {"kael_cpu_backend": kael.backends.current("cpu").name}
    try:
        info["kael_cpu_isa"] = kael.cpu.isa()
    except Exception as exc:  # no C++ backend
        info["kael_cpu_isa"] = f"unavailable ({type(exc).__name__}: {exc})"
    info["llama_bench"] = find_tool("llama-bench")
    info["llama_quantize"] = find_tool("llama-quantize")
    return info


# -- the run --------------------------------------------------------------------------------------


def _csv(text: str) -> list[str]:
    return [s.strip() for s in text.split(",") if s.strip()]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", type=_csv, default=list(MODELS), help="comma-separated, of " + ",".join(MODELS))
    ap.add_argument(
        "--formats", type=_csv, default=list(FORMATS), help="comma-separated, of " + ",".join(ALLOWED_FORMATS)
    )
    ap.add_argument("--threads", type=lambda s: [int(v) for v in _csv(s)], default=[1, 2], help="e.g. 1,2")
    ap.add_argument("--tokens", type=int, default=None, help="new tokens to decode (default 128; --quick 8)")
    ap.add_argument("--prompt", type=int, default=None, help="prefill prompt tokens (default 512; --quick 32)")
    ap.add_argument("--repeats", type=int, default=None, help="best of this many runs (default 2; --quick 1)")
    ap.add_argument("--quantizer", choices=("llama.cpp", "kael"), default="llama.cpp", help="who makes block files")
    ap.add_argument("--no-llama-cpp", action="store_true", help="measure kael only")
    ap.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run for tests")
    ap.add_argument("--keep", type=Path, default=None, help="write the checkpoints and GGUF files here and keep them")
    ap.add_argument("--worker", type=Path, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    for name, allowed in (("models", MODELS), ("formats", ALLOWED_FORMATS)):
        got = getattr(args, name)
        if not got or any(v not in allowed for v in got):
            ap.error(f"--{name}: expected some of {','.join(allowed)}, got {','.join(got) or 'nothing'}")
    if not args.threads or any(t < 1 for t in args.threads):
        ap.error(f"--threads: expected counts >= 1, got {args.threads}")
    for name, full, quick in (("tokens", 128, 8), ("prompt", 512, 32), ("repeats", 2, 1)):
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
        if getattr(args, name) < (2 if name == "tokens" else 1):
            ap.error(f"--{name}: expected at least {2 if name == 'tokens' else 1}, got {getattr(args, name)}")
    if args.quantizer == "llama.cpp" and find_tool("llama-quantize") is None:
        args.quantizer = "kael"  # the same bytes (tests/core/test_quant_mixes.py); said in the report
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.worker is not None:
        print(json.dumps(worker_kael(args.worker, args.threads[0], args.tokens, args.prompt, args.repeats)))
        return
    llama = not args.no_llama_cpp and find_tool("llama-bench") is not None
    report: dict[str, Any] = {
        "prompt_tokens": PROMPT_TOKENS,
        "new_tokens": args.tokens,
        "prefill_tokens": args.prompt,
        "repeats": args.repeats,
        "quantizer": args.quantizer,
        "system": system_info(),
        "bandwidth_gb_s": {str(t): round(bandwidth(t, 0.25 if args.quick else 1.0) / 1e9, 2) for t in args.threads},
        "llc_bytes": llc_bytes(),
        "note": "one run; llama-bench's tg starts from an empty context, kael's decode after a 16-token prompt",
    }
    if not llama:
        report["llama_cpp_skipped"] = "disabled by --no-llama-cpp" if args.no_llama_cpp else "llama-bench not found"
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="kael-quant-bench-") as tmp:
        work = args.keep or Path(tmp)
        report["file_mb"], report["bytes_per_token"], report["roofline_bandwidth_gb_s"] = {}, {}, {}
        for name in args.models:
            hf_dir = work / name
            hf_dir.mkdir(parents=True, exist_ok=True)
            write_checkpoint(name, hf_dir, args.quick)
            files = export(hf_dir, work, name, args.formats, args.quantizer, max(args.threads))
            for fmt, path in files.items():
                report["file_mb"][f"{name} {fmt}"] = round(path.stat().st_size / 1e6, 2)
                size = report["bytes_per_token"][f"{name} {fmt}"] = bytes_per_token(path)
                report["roofline_bandwidth_gb_s"][f"{name} {fmt}"] = {
                    str(t): round(bandwidth(t, size / 2**30) / 1e9, 2) for t in args.threads
                }
            for t in args.threads:
                runs.append({"model": name, "format": "float32 safetensors", **_run_kael(hf_dir, t, args)})
                for fmt, path in files.items():
                    runs.append({"model": name, "format": fmt, **_run_kael(path, t, args)})
                    if llama:
                        bench = llama_bench(path, t, args.prompt, args.tokens, max(2, args.repeats))
                        runs.append({"model": name, "format": fmt, **bench})
    report["runs"] = runs
    report["summary"] = summarize(runs, report["bytes_per_token"], report["roofline_bandwidth_gb_s"])
    print(json.dumps(report, indent=2, default=str))


def summarize(runs: list[dict[str, Any]], per_token: dict[str, int], bw: dict[str, dict[str, float]]) -> dict[str, Any]:
    """{"<model> <format> <threads>t": kael and llama-bench decode/prefill tok/s, their ratios, roofline fractions,
    kael's memory after loading and over the run and each one's peak resident memory (MB)}.

    ``bw["<model> <format>"][threads]``: the read bandwidth (GB/s) of a working set of that file's size."""
    table: dict[str, dict[str, Any]] = {}
    for r in runs:
        if "error" in r or "decode_tok_s" not in r:
            continue
        row = table.setdefault(f"{r['model']} {r['format']} {r['threads']}t", {})
        who = "kael" if r["engine"] == "kael" else "llama_bench"
        row[f"{who}_decode_tok_s"] = round(r["decode_tok_s"], 2)
        row[f"{who}_prefill_tok_s"] = round(r["prefill_tok_s"], 1)
        if r.get("peak_rss_mb") is not None:
            row[f"{who}_peak_rss_mb"] = r["peak_rss_mb"]
        if who == "kael" and r.get("loaded_rss_mb") is not None and r.get("base_rss_mb") is not None:
            row["kael_loaded_mb"] = round(r["loaded_rss_mb"] - r["base_rss_mb"], 1)
            row["kael_end_mb"] = round(r["end_rss_mb"] - r["base_rss_mb"], 1)
            row["kael_run_mb"] = round(r["peak_rss_mb"] - r["base_rss_mb"], 1)
        file = f"{r['model']} {r['format']}"
        size = per_token.get(file)
        if size and file in bw:
            row[f"{who}_roofline"] = round(size * r["decode_tok_s"] / (bw[file][str(r["threads"])] * 1e9), 3)
    for row in table.values():
        if "llama_bench_decode_tok_s" in row and "kael_decode_tok_s" in row:
            row["decode_kael_over_llama"] = round(row["kael_decode_tok_s"] / row["llama_bench_decode_tok_s"], 3)
            row["prefill_kael_over_llama"] = round(row["kael_prefill_tok_s"] / row["llama_bench_prefill_tok_s"], 3)
    return table


if __name__ == "__main__":
    main()
