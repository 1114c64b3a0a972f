"""GPT-2 small in GGUF weight formats: kael against llama.cpp on the same files, printing JSON.

The script builds a GPT-2 small (124M shape) with random weights (transformers' N(0, 0.02)
init, ``GPT2LMHeadModel.save_pretrained`` with the GPT-2 tokenizer from ``tests/data``;
nothing is downloaded), exports it to GGUF once per format (F32, BF16, F16, Q8_0, Q4_0),
by kael (``kael.models.save_gguf(model, path, tokenizer, weights=...)``, the default) or
by llama.cpp (``--converter llama.cpp``: its ``convert_hf_to_gguf.py``, and for Q4_0
``llama_model_quantize`` over the F32 file with every tensor Q4_0, since the converter
has no Q4_0 output), then measures, for each format and thread count:

* kael loading that GGUF file (``kael.models.load_gguf``) and llama.cpp loading it
  (``llama_cpp.Llama(path, n_threads=t, n_threads_batch=t, n_ctx=1024, n_batch=512)``);
* prefill tokens/s of a 512-token prompt (one forward pass into the KV cache);
* greedy decode tokens/s for a 16-token prompt and 128 new tokens (time from the first
  new token to the last, so the prefill is not counted);
* how many leading greedy tokens the two engines agree on (random weights give nearly
  flat logits, so a tie broken differently ends the agreement early);

plus kael's float32 path from the safetensors checkpoint (``kael.models.from_pretrained``)
as the floor reference, the instruction set kael's CPU kernels picked
(``kael.cpu.isa()``) and llama.cpp's system info. Each measurement runs in a fresh worker
process with ``KAEL_NUM_THREADS``, ``OMP_NUM_THREADS`` and ``OPENBLAS_NUM_THREADS`` set,
as ``benchmarks/gpt2.py`` does; llama.cpp is skipped (its entries say why) when
``llama_cpp`` (llama-cpp-python) is not importable.

    python benchmarks/quantized.py [--formats f32,bf16,f16,q8_0,q4_0] [--threads 1,2] [--tokens 128]
                                   [--prompt 512] [--repeats 2] [--converter kael|llama.cpp]
                                   [--llama-cpp-src DIR] [--keep DIR] [--quick]

``--quick`` is a smoke run (a 2-layer, 64-wide GPT-2 with GPT-2's vocabulary, 8 new tokens,
a 32-token prefill, one repeat), for tests.
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

ROOT = Path(__file__).resolve().parent.parent
TOKENIZER = ROOT / "tests" / "data" / "gpt2-tokenizer"
FORMATS = ("f32", "bf16", "f16", "q8_0", "q4_0")
GPT2_SMALL: dict[str, Any] = {"n_embd": 768, "n_layer": 12, "n_head": 12, "n_positions": 1024, "vocab_size": 50257}
GPT2_QUICK: dict[str, Any] = {"n_embd": 64, "n_layer": 2, "n_head": 2, "n_positions": 128, "vocab_size": 50257}
PROMPT_TOKENS = 16
WARMUP_TOKENS = 4  # the decode warm-up before the timed runs
LLAMA_FTYPE_MOSTLY_Q4_0 = 2  # llama.h's llama_ftype


# -- the checkpoint and its GGUF files -------------------------------------------------------------


def write_checkpoint(directory: Path, shape: dict[str, Any], seed: int = 0) -> float:
    """A GPT2LMHeadModel of `shape` with random weights and the GPT-2 tokenizer in directory; returns seconds."""
    import torch
    import transformers

    start = time.perf_counter()
    torch.manual_seed(seed)
    # n_ctx: transformers no longer writes it, llama.cpp's GPT-2 converter still reads it
    cfg = transformers.GPT2Config(**shape, n_ctx=shape["n_positions"], bos_token_id=50256, eos_token_id=50256)
    transformers.GPT2LMHeadModel(cfg).save_pretrained(directory)
    for name in ("vocab.json", "merges.txt"):
        shutil.copy(TOKENIZER / name, directory / name)
    return time.perf_counter() - start


def export_kael(hf_dir: Path, out_dir: Path, formats: list[str]) -> dict[str, Path]:
    """One GGUF file per format, written by kael's save_gguf from the float checkpoint."""
    import kael
    from kael.models import from_pretrained, save_gguf

    model = from_pretrained(hf_dir)
    tok = kael.BpeTokenizer.from_directory(hf_dir)
    paths = {}
    for fmt in formats:
        paths[fmt] = out_dir / f"gpt2-{fmt}.gguf"
        save_gguf(model, paths[fmt], tok, weights=fmt)
    return paths


def llama_cpp_source(given: Path | None, scratch: Path) -> Path:
    """A llama.cpp source tree holding convert_hf_to_gguf.py: the given tree or llama-cpp-python sdist
    (.tar.gz), else build/llama.cpp/src, else the sdist of the installed llama-cpp-python (pip download)
    unpacked into scratch (its vendored llama.cpp)."""
    if given is not None and given.is_file():
        return _unpack_sdist(given, scratch)
    for cand in (given, ROOT / "build" / "llama.cpp" / "src"):
        if cand is not None and (cand / "convert_hf_to_gguf.py").is_file():
            return cand
    if given is not None:
        raise SystemExit(f"--llama-cpp-src {given}: no convert_hf_to_gguf.py there")
    import llama_cpp

    sdist = scratch / "sdist"
    # only this package from source, and no build isolation: pip must not build cmake from source
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", "llama-cpp-python"]
    cmd += ["--no-build-isolation", "-d", str(sdist), f"llama-cpp-python=={llama_cpp.__version__}"]
    r = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if r.returncode != 0:
        raise SystemExit(
            f"pip download of the llama-cpp-python sdist failed (give --llama-cpp-src):\n{r.stderr[-2000:]}"
        )
    return _unpack_sdist(next(sdist.glob("llama_cpp_python-*.tar.gz")), scratch)


def _unpack_sdist(archive: Path, scratch: Path) -> Path:
    import tarfile

    with tarfile.open(archive) as tar:
        tar.extractall(scratch / "src", filter="data")
    tree = next((scratch / "src").glob("llama_cpp_python-*")) / "vendor" / "llama.cpp"
    if not (tree / "convert_hf_to_gguf.py").is_file():
        raise SystemExit(f"{archive}: no vendor/llama.cpp/convert_hf_to_gguf.py inside")
    return tree


def export_llama_cpp(hf_dir: Path, out_dir: Path, formats: list[str], src: Path) -> dict[str, Path]:
    """One GGUF file per format, written by llama.cpp's converter (and its quantizer for q4_0)."""
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(src / "gguf-py"), os.environ.get("PYTHONPATH")) if p)
    )
    paths = {}
    for fmt in sorted(formats, key=lambda f: f != "f32"):  # f32 first: q4_0 is quantized from it
        paths[fmt] = out_dir / f"gpt2-{fmt}.gguf"
        if fmt == "q4_0":
            f32 = paths.get("f32") or out_dir / "gpt2-f32-for-q4_0.gguf"
            if not f32.exists():
                _convert(src, hf_dir, f32, "f32", env)
            _quantize_q4_0(f32, paths[fmt])
        else:
            _convert(src, hf_dir, paths[fmt], fmt, env)
    return paths


def _convert(src: Path, hf_dir: Path, out: Path, outtype: str, env: dict[str, str]) -> None:
    cmd = [sys.executable, str(src / "convert_hf_to_gguf.py"), str(hf_dir), "--outfile", str(out), "--outtype", outtype]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if r.returncode != 0:
        raise SystemExit(f"convert_hf_to_gguf.py --outtype {outtype} failed:\n{r.stderr[-3000:]}")


def _quantize_q4_0(src: Path, out: Path) -> None:
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = LLAMA_FTYPE_MOSTLY_Q4_0
    params.pure = True  # every tensor Q4_0 (llama.cpp's default makes the head Q6_K, which kael does not read)
    if llama_cpp.llama_model_quantize(str(src).encode(), str(out).encode(), params) != 0:
        raise SystemExit(f"llama_model_quantize {src} -> Q4_0 failed")


# -- measurements (one worker process per engine, format and thread count) --------------------------


def _best(fn: Any, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def _decode_rate(stamps: list[float]) -> float:
    return (len(stamps) - 1) / (stamps[-1] - stamps[0]) if len(stamps) > 1 else float("nan")


def _prompts(vocab: int, prefill: int) -> tuple[list[int], list[int]]:
    """(the decode prompt, the prefill prompt): the same random ids for every engine."""
    rng = np.random.default_rng(1)
    return rng.integers(0, vocab, PROMPT_TOKENS).tolist(), rng.integers(0, vocab, prefill).tolist()


def worker_kael(path: Path, threads: int, tokens: int, prefill: int, repeats: int) -> dict[str, Any]:
    """kael on a GGUF file (load_gguf) or, for a directory, the float32 safetensors checkpoint."""
    import kael
    from kael.models import from_pretrained, load_gguf

    try:
        kael.set_num_threads(threads)
    except (AttributeError, ImportError):  # no threaded backend installed
        pass
    report: dict[str, Any] = {"engine": "kael", "threads": threads}
    start = time.perf_counter()
    model = from_pretrained(path) if path.is_dir() else load_gguf(path)[0]
    report["load_s"] = time.perf_counter() - start
    report["weights_scheme"] = getattr(model, "weights_scheme", None)
    report["backend"] = kael.backends.current("cpu").name
    prompt, long_prompt = _prompts(model.vocab_size, prefill)

    def run_prefill() -> None:
        with kael.no_grad():
            model(kael.tensor([long_prompt]), model.new_cache(max_positions=prefill), last_only=True)

    run_prefill()
    report["prefill_tok_s"] = prefill / _best(run_prefill, repeats)

    def decode(n: int = tokens) -> tuple[list[int], list[float]]:
        stamps: list[float] = []
        ids = model.generate(prompt, n, on_token=lambda t: stamps.append(time.perf_counter()))
        return ids, stamps

    decode(WARMUP_TOKENS)  # first-call allocations and caches
    runs = [decode() for _ in range(repeats)]
    report["decode_tok_s"] = max(_decode_rate(r[1]) for r in runs)
    report["tokens"] = runs[0][0]
    return report


def worker_llama_cpp(path: Path, threads: int, tokens: int, prefill: int, repeats: int) -> dict[str, Any]:
    """llama.cpp (through llama-cpp-python) on a GGUF file: the same prompts, greedy."""
    import llama_cpp

    report: dict[str, Any] = {"engine": "llama.cpp", "threads": threads, "version": llama_cpp.__version__}
    start = time.perf_counter()
    llm = llama_cpp.Llama(
        model_path=str(path), n_threads=threads, n_threads_batch=threads, n_ctx=1024, n_batch=512, verbose=False
    )
    report["load_s"] = time.perf_counter() - start
    prompt, long_prompt = _prompts(llm.n_vocab(), prefill)

    def run_prefill() -> None:
        llm.reset()
        llm.eval(long_prompt)

    run_prefill()
    report["prefill_tok_s"] = prefill / _best(run_prefill, repeats)

    def decode(n: int = tokens) -> tuple[list[int], list[float]]:
        ids: list[int] = []
        stamps: list[float] = []
        for tok in llm.generate(prompt, temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0, reset=True):
            ids.append(int(tok))
            stamps.append(time.perf_counter())
            if len(ids) == n:
                break
        return ids, stamps

    decode(WARMUP_TOKENS)  # first-call allocations and caches
    runs = [decode() for _ in range(repeats)]
    report["decode_tok_s"] = max(_decode_rate(r[1]) for r in runs)
    report["tokens"] = runs[0][0]
    return report


def system_info() -> dict[str, Any]:
    """The instruction set kael's CPU kernels picked, and llama.cpp's system info (when installed)."""
    info: dict[str, Any] = {}
    try:
        import kael

        backend = kael.backends.current("cpu")
        info["kael_cpu_backend"] = backend.name
        # without these kernels kael runs the ops' decompositions (dequantize on every call)
        info["kael_cpu_weight_kernels"] = sorted({"dequantize", "quantized_linear"} & set(backend.supported_ops()))
        info["kael_cpu_isa"] = kael.cpu.isa()
    except Exception as exc:  # an older kael without kael.cpu.isa, or no C++ backend
        info["kael_cpu_isa"] = f"unavailable ({type(exc).__name__}: {exc})"
    try:
        import llama_cpp
    except ImportError as exc:
        info["llama_cpp"] = f"not installed ({exc})"
        return info
    raw = llama_cpp.llama_print_system_info()
    info["llama_cpp_system_info"] = raw.decode() if isinstance(raw, bytes) else str(raw)
    info["llama_cpp_version"] = llama_cpp.__version__
    return info


def _have_llama_cpp() -> str | None:
    """None when llama_cpp imports, else why not."""
    try:
        import llama_cpp  # noqa: F401
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def _run_worker(engine: str, path: Path, threads: int, args: argparse.Namespace) -> dict[str, Any]:
    src = str(ROOT / "kael_core" / "src")
    env = dict(
        os.environ,
        KAEL_NUM_THREADS=str(threads),
        OMP_NUM_THREADS=str(threads),
        OPENBLAS_NUM_THREADS=str(threads),
        MKL_NUM_THREADS=str(threads),
        PYTHONPATH=os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH")) if p),
    )
    cmd = [sys.executable, __file__, "--worker", engine, str(path), "--threads", str(threads)]
    cmd += ["--tokens", str(args.tokens), "--prompt", str(args.prompt), "--repeats", str(args.repeats)]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if r.returncode != 0:
        return {"engine": engine, "threads": threads, "error": r.stderr.strip()[-2000:] or f"exit {r.returncode}"}
    return dict(json.loads(r.stdout.strip().splitlines()[-1]))


def _agreement(a: list[int], b: list[int]) -> int:
    """How many leading tokens a and b share."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _csv(text: str) -> list[str]:
    return [s.strip() for s in text.split(",") if s.strip()]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--formats", type=_csv, default=list(FORMATS), help="comma-separated, of " + ",".join(FORMATS))
    ap.add_argument("--threads", type=lambda s: [int(v) for v in _csv(s)], default=[1, 2], help="e.g. 1,2")
    ap.add_argument("--tokens", type=int, default=None, help="new tokens to decode (default 128; --quick 8)")
    ap.add_argument("--prompt", type=int, default=None, help="prefill prompt tokens (default 512; --quick 32)")
    ap.add_argument("--repeats", type=int, default=None, help="best of this many runs (default 2; --quick 1)")
    ap.add_argument("--converter", choices=("kael", "llama.cpp"), default="kael", help="who writes the GGUF files")
    ap.add_argument("--llama-cpp-src", type=Path, default=None, help="a llama.cpp source tree (--converter llama.cpp)")
    ap.add_argument("--no-llama-cpp", action="store_true", help="measure kael only")
    ap.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run for tests")
    ap.add_argument("--keep", type=Path, default=None, help="write the checkpoint and GGUF files here and keep them")
    ap.add_argument("--worker", nargs=2, metavar=("ENGINE", "PATH"), default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    bad = [f for f in args.formats if f not in FORMATS]
    if bad or not args.formats:
        ap.error(f"--formats: expected some of {','.join(FORMATS)}, got {','.join(args.formats) or 'nothing'}")
    if not args.threads or any(t < 1 for t in args.threads):
        ap.error(f"--threads: expected counts >= 1, got {args.threads}")
    for name, full, quick in (("tokens", 128, 8), ("prompt", 512, 32), ("repeats", 2, 1)):
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
        if getattr(args, name) < (2 if name == "tokens" else 1):
            ap.error(f"--{name}: expected at least {2 if name == 'tokens' else 1}, got {getattr(args, name)}")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.worker is not None:
        engine, path = args.worker[0], Path(args.worker[1])
        fn = worker_llama_cpp if engine == "llama.cpp" else worker_kael
        print(json.dumps(fn(path, args.threads[0], args.tokens, args.prompt, args.repeats)))
        return
    shape = GPT2_QUICK if args.quick else GPT2_SMALL
    why_no_llama = "disabled by --no-llama-cpp" if args.no_llama_cpp else _have_llama_cpp()
    if args.converter == "llama.cpp" and why_no_llama is not None:
        raise SystemExit(f"--converter llama.cpp needs llama_cpp (llama-cpp-python): {why_no_llama}")
    with tempfile.TemporaryDirectory(prefix="kael-quant-bench-") as tmp:
        work = args.keep or Path(tmp)
        hf_dir = work / "hf"
        hf_dir.mkdir(parents=True, exist_ok=True)
        report: dict[str, Any] = {
            "model": f"gpt2 {shape['n_layer']} layers, {shape['n_embd']} wide (random weights)",
            "prompt_tokens": PROMPT_TOKENS,
            "new_tokens": args.tokens,
            "prefill_tokens": args.prompt,
            "repeats": args.repeats,
            "converter": args.converter,
        }
        report["write_checkpoint_s"] = write_checkpoint(hf_dir, shape)
        start = time.perf_counter()
        if args.converter == "kael":
            files = export_kael(hf_dir, work, args.formats)
        else:
            files = export_llama_cpp(hf_dir, work, args.formats, llama_cpp_source(args.llama_cpp_src, work))
        report["export_s"] = time.perf_counter() - start
        report["file_mb"] = {f: round(p.stat().st_size / 1e6, 2) for f, p in files.items()}
        report["system"] = system_info()
        if why_no_llama is not None:
            report["llama_cpp_skipped"] = why_no_llama
        runs: list[dict[str, Any]] = []
        for t in args.threads:
            floor = _run_worker("kael", hf_dir, t, args)
            runs.append({"format": "float32 safetensors", **floor})
            for fmt, path in files.items():
                k = _run_worker("kael", path, t, args)
                runs.append({"format": fmt, **k})
                if why_no_llama is None:
                    ll = _run_worker("llama.cpp", path, t, args)
                    if "tokens" in k and "tokens" in ll:
                        ll["tokens_agreeing_with_kael"] = _agreement(k["tokens"], ll["tokens"])
                    runs.append({"format": fmt, **ll})
        for r in runs:
            r.pop("tokens", None)
        report["runs"] = runs
        report["summary"] = summarize(runs)
    print(json.dumps(report, indent=2, default=str))


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """{"<format> <threads>t": {"kael_decode_tok_s": .., "llama_cpp_decode_tok_s": .., ratios..}}."""
    table: dict[str, dict[str, Any]] = {}
    for r in runs:
        if "error" in r:
            continue
        row = table.setdefault(f"{r['format']} {r['threads']}t", {})
        who = "kael" if r["engine"] == "kael" else "llama_cpp"
        row[f"{who}_decode_tok_s"] = round(r["decode_tok_s"], 2)
        row[f"{who}_prefill_tok_s"] = round(r["prefill_tok_s"], 1)
    for row in table.values():
        if "llama_cpp_decode_tok_s" in row and "kael_decode_tok_s" in row:
            row["decode_kael_over_llama_cpp"] = round(row["kael_decode_tok_s"] / row["llama_cpp_decode_tok_s"], 3)
            row["prefill_kael_over_llama_cpp"] = round(row["kael_prefill_tok_s"] / row["llama_cpp_prefill_tok_s"], 3)
    return table


if __name__ == "__main__":
    main()
