"""Speculative decoding (issue 32): kael with against kael without, on kael's engine, printing JSON.

Tasks, each at ``--threads`` (default 1 and 2), greedy, one request at a time:

* ``copy``: the bundled code model (kael-tiny, trained on CPython's standard library, a byte a
  token, 128 positions) asked to write again a function the prompt holds whole (``CODE``, then
  its first line's start), for the tokens its context leaves: prompt lookup (``ngram``) drafts
  the function (goal: at least 2x decode tok/s). A model this small does not copy it faithfully
  (it drifts into a run of zeros), so acceptance is the model's, not the proposer's;
* ``rewrite``: kael-tiny-chat asked for a function whose source the conversation already holds
  (its assistant turn quoted it), through its chat template;
* ``random``: GPT-2 small with random weights on a random prompt, sampled (temperature 1,
  seeded): nothing to copy, so speculation should pause itself (goal: at least 0.97x), with
  ``ngram`` and with a ``draft`` model (a 2-layer random GPT-2 over the same vocabulary);
* ``loop``: the same greedily, which falls into a repeating loop (as random models do): copy-heavy
  by construction, on a model whose decode step reads 500 MB of weights.

And ``server``: kael-server on kael-tiny at 8 concurrent streaming-free clients, 48 requests,
half copy-heavy and half not, aggregate tok/s with ``--speculative ngram`` against without (goal: at least 1.3x).

Every speculative run is checked to give the plain run's tokens.

And ``llama_server``: llama.cpp's own prompt lookup as its users run it, ``llama-server
--spec-type ngram-simple`` and ``ngram-map-k`` (lookup of 4 ids, drafts of 6: the sizes kael's
``ngram`` runs with) against ``--spec-type none``, one slot, ``-t``/``-tb`` the thread count, on GPT-2 small's random
weights written as an F32 GGUF file by kael (the model of ``random``/``loop``), the same prompt
ids through ``/completion`` (``ignore_eos``, no prompt cache), greedy (``loop``) and at temperature 1
(``random``, seeded); its decode tok/s is the server's own ``timings.predicted_per_second``, its
acceptance ``draft_n_accepted / draft_n``. Skipped when the binary is absent (build it with
``scripts/build_llama_cpp.sh``) or with ``--no-llama``.

    python benchmarks/speculative.py [--threads 1 2] [--tokens 64] [--repeats 3] [--no-llama]
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

__all__ = ["main"]

MODELS = Path(__file__).resolve().parents[1] / "kael_server" / "src" / "kael_server" / "models"
GPT2_TOKENIZER = Path(__file__).resolve().parents[1] / "tests" / "data" / "gpt2-tokenizer"
CODE = "def _inc(x, lo):\n    if x < lo:\n        raise ValueError(x)\n    return x + 1\n\n"
CODE_START = "def _inc("
SERVER_REQUESTS = 48  # six rounds of the 8 clients: a run of well under a second is mostly the host's noise


def _decode(
    model: Any, prompt: list[int], tokens: int, speculator: Any, eos: list[int], temperature: float = 0.0
) -> tuple[list[int], float]:
    """One request's tokens through EngineCore (greedy, or seeded sampling at ``temperature``) and
    its decode tok/s (the first token excluded)."""
    import kael
    from kael.engine import EngineCore, Request, SamplingParams, TokenSampler
    from kael.models import BatchDecoder

    core = EngineCore.on(BatchDecoder(model, rows=1), speculator=speculator)
    params = SamplingParams(max_tokens=tokens, temperature=temperature, ignore_eos=True)
    sampler = TokenSampler(params, prompt, kael.Generator().manual_seed(7)) if temperature else None
    req = Request(prompt, params, eos_ids=eos, sampler=sampler)
    core.add(req)
    first = None
    while core.has_unfinished:
        events = core.step()
        if first is None and any(e.tokens for e in events):
            first = (time.perf_counter(), len(req.output_ids))
    assert first is not None
    seconds = time.perf_counter() - first[0]
    return list(req.output_ids), (len(req.output_ids) - first[1]) / max(seconds, 1e-9)


def _task(
    model: Any, prompt: list[int], tokens: int, repeats: int, make: dict[str, Any], temperature: float = 0.0
) -> dict[str, Any]:
    out: dict[str, Any] = {"prompt_tokens": len(prompt), "new_tokens": tokens, "temperature": temperature}
    plain_ids: list[int] | None = None
    best: dict[str, tuple[float, float | None]] = {name: (0.0, None) for name in make}
    for _ in range(repeats):  # the methods take turns, so a slow spell of the host hits them alike
        for name, factory in make.items():
            spec = factory() if factory else None
            ids, tok_s = _decode(model, prompt, tokens, spec, [], temperature)
            if plain_ids is None:
                plain_ids = ids
            assert ids == plain_ids, f"{name}: speculation changed the output"
            if tok_s > best[name][0]:
                best[name] = (tok_s, spec.acceptance_rate if spec is not None else None)
    for name, (tok_s, rate) in best.items():
        out[name] = {"decode_tok_s": tok_s, "acceptance_rate": rate}
    base = out["plain"]["decode_tok_s"]
    for name in make:
        if name != "plain":
            out[name]["speedup"] = out[name]["decode_tok_s"] / base
    return out


def _server(tokens: int, speculative: bool, requests: int = SERVER_REQUESTS) -> dict[str, float]:
    from kael_server.config import ServerConfig
    from kael_server.loading import load_app
    from litestar.testing import TestClient

    settings: dict[str, Any] = {"speculative": "ngram", "spec_tokens": 6} if speculative else {}
    app = load_app(ServerConfig(data=str(MODELS / "kael-tiny"), slots=8, **settings))
    room = 128 - tokens - 1  # kael-tiny's context, a byte a token
    prompts = [(CODE + CODE_START)[-room:] if i % 2 == 0 else f"import os\nx = {i}\n" for i in range(requests)]
    with TestClient(app) as client:
        while client.get("/ready").status_code != 200:
            time.sleep(0.05)

        def one(prompt: str) -> int:
            body = {"prompt": prompt, "max_tokens": tokens, "temperature": 0}
            return int(client.post("/v1/completions", json=body).json()["usage"]["completion_tokens"])

        start = time.perf_counter()
        with ThreadPoolExecutor(8) as pool:
            produced = sum(pool.map(one, prompts))
        seconds = time.perf_counter() - start
    return {"clients": 8, "requests": len(prompts), "aggregate_tok_s": produced / seconds}


def _llama_server(gguf: Path, prompt: list[int], tokens: int, threads: int, repeats: int) -> dict[str, Any]:
    """llama-server with and without ngram-simple drafts on ``gguf``: the loop (greedy) and random (temperature
    1) tasks' decode tok/s, best of ``repeats`` (see the module docstring)."""
    import httpx
    from _llama_cpp_bench import find_tool
    from server import started_llama_server

    binary = find_tool("llama-server")
    assert binary is not None
    common = ("-t", str(threads), "-tb", str(threads), "--no-warmup")
    modes = {
        "plain": ("--spec-type", "none"),
        **{
            kind: ("--spec-type", kind, f"--spec-{kind}-size-n", "4", f"--spec-{kind}-size-m", "6")
            for kind in ("ngram-simple", "ngram-map-k")
        },
    }
    out: dict[str, Any] = {"binary": binary, "flags": {name: " ".join(flags) for name, flags in modes.items()}}
    for name, flags in modes.items():
        with started_llama_server(Path(binary), gguf, 1, 1024, (*common, *flags)) as url:
            for task, temperature in (("loop", 0.0), ("random", 1.0)):
                best: dict[str, Any] = {"decode_tok_s": 0.0}
                for _ in range(repeats):
                    body = {
                        "prompt": prompt,
                        "n_predict": tokens,
                        "temperature": temperature,
                        "seed": 7,
                        "ignore_eos": True,
                        "cache_prompt": False,
                    }
                    t = httpx.post(f"{url}/completion", json=body, timeout=600).json()["timings"]
                    if t["predicted_per_second"] > best["decode_tok_s"]:
                        drafted = t.get("draft_n", 0)
                        best = {
                            "decode_tok_s": t["predicted_per_second"],
                            "tokens": t["predicted_n"],
                            "acceptance_rate": t.get("draft_n_accepted", 0) / drafted if drafted else None,
                        }
                out.setdefault(task, {})[name] = best
    for task in ("loop", "random"):
        for kind in ("ngram-simple", "ngram-map-k"):
            out[task][kind]["speedup"] = out[task][kind]["decode_tok_s"] / out[task]["plain"]["decode_tok_s"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-llama", action="store_true", help="skip llama-server's ngram-simple anchor")
    args = ap.parse_args()

    import kael
    import numpy as np
    from kael.engine import DraftModelProposer, NgramProposer, Speculator
    from kael.models import GPT, from_pretrained
    from kael.tokenizer import load_tokenizer

    tiny, tiny_tok = from_pretrained(MODELS / "kael-tiny"), load_tokenizer(MODELS / "kael-tiny")
    chat, chat_tok = from_pretrained(MODELS / "kael-tiny-chat"), load_tokenizer(MODELS / "kael-tiny-chat")
    big = GPT(50257, 1024, 12, 12, 768, init=False)
    with kael.no_grad():
        rng = np.random.default_rng(0)
        for _, p in big.named_parameters():
            p.copy_(kael.from_numpy((rng.standard_normal(p.shape) * 0.02).astype(np.float32)))
    drafter = GPT(50257, 1024, 2, 4, 128, generator=kael.Generator().manual_seed(1))

    code_prompt = tiny_tok.encode(CODE + CODE_START)
    code_tokens = min(args.tokens, tiny.max_positions - len(code_prompt) - 1)
    fn = CODE.strip()
    conv = [
        {"role": "user", "content": "Write _inc(x, lo)."},
        {"role": "assistant", "content": fn},
        {"role": "user", "content": "Write _inc(x, lo) again."},
    ]
    rendered = chat_tok.chat_template.render(conv, add_generation_prompt=True)
    chat_prompt = chat_tok.encode(rendered)[-(chat.max_positions - args.tokens) :]
    random_prompt = np.random.default_rng(2).integers(0, 50257, size=32).tolist()

    def ngram() -> Any:
        return Speculator(NgramProposer(n_max=4, k=6))

    report: dict[str, Any] = {"tokens": args.tokens, "repeats": args.repeats, "runs": []}
    gguf: Path | None = None
    from _llama_cpp_bench import find_tool

    if not args.no_llama and find_tool("llama-server") is not None:
        from kael.models import save_gguf

        gguf = Path(tempfile.mkdtemp(prefix="kael-spec-")) / "gpt2-small-random-f32.gguf"
        tok = kael.BpeTokenizer.from_files(GPT2_TOKENIZER / "vocab.json", GPT2_TOKENIZER / "merges.txt")
        save_gguf(big, gguf, tok, weights="f32")
    for threads in args.threads:
        kael.set_num_threads(threads)
        run: dict[str, Any] = {"threads": threads}
        run["copy"] = _task(tiny, code_prompt, code_tokens, args.repeats, {"plain": None, "ngram": ngram})
        run["rewrite"] = _task(chat, chat_prompt, args.tokens, args.repeats, {"plain": None, "ngram": ngram})
        methods = {
            "plain": None,
            "ngram": ngram,
            "draft": lambda: Speculator(DraftModelProposer(drafter, k=4, rows=1, target=big)),
        }
        run["random"] = _task(big, random_prompt, args.tokens, args.repeats, methods, temperature=1.0)
        run["loop"] = _task(big, random_prompt, args.tokens, args.repeats, methods)
        if gguf is not None:
            theirs = run["llama_server"] = _llama_server(gguf, random_prompt, args.tokens, threads, args.repeats)
            for task in ("loop", "random"):  # kael's decode over llama.cpp's, each with and without drafts
                theirs[task]["kael_over_llama"] = {  # kael's ngram against llama.cpp's best n-gram mode
                    "plain": run[task]["plain"]["decode_tok_s"] / theirs[task]["plain"]["decode_tok_s"],
                    "ngram": run[task]["ngram"]["decode_tok_s"]
                    / max(theirs[task][k]["decode_tok_s"] for k in ("ngram-simple", "ngram-map-k")),
                }
        runs = [(_server(args.tokens, False), _server(args.tokens, True)) for _ in range(args.repeats)]
        plain = max((p for p, _ in runs), key=lambda r: r["aggregate_tok_s"])
        spec = max((s for _, s in runs), key=lambda r: r["aggregate_tok_s"])
        run["server"] = {"plain": plain, "ngram": spec, "speedup": spec["aggregate_tok_s"] / plain["aggregate_tok_s"]}
        print(json.dumps(run), flush=True)
        report["runs"].append(run)
    if gguf is not None:
        shutil.rmtree(gguf.parent, ignore_errors=True)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
