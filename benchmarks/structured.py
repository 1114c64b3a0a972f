"""Grammar-library measurements for kael.constraints (issue 30): tokenizer setup, JSON-schema
compile and per-token mask time and resident memory of llguidance, xgrammar and outlines-core
on GPT-2's 50257-token vocabulary (the bundled ``tests/data/gpt2-tokenizer``).

Run: ``python benchmarks/structured.py [--only llguidance]``. Compile and mask timings only;
it walks each grammar with the first allowed token so every library sees the same work.
``--batch`` then runs ``structured_batch.py`` (kael's engine, 8 rows constrained against
unconstrained, on GPT-2 small and a SmolLM2-135M-shaped Llama; its flags follow ``--``).
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from kael.tokenizer import BpeTokenizer

__all__ = ["main", "schemas"]

_TOK_DIR = Path(__file__).resolve().parents[1] / "tests" / "data" / "gpt2-tokenizer"


def schemas() -> list[dict[str, Any]]:
    """Ten JSON schemas of increasing size (1 to 46 properties, nested objects and arrays)."""
    out: list[dict[str, Any]] = []
    for k in range(10):
        props: dict[str, Any] = {}
        for i in range(1 + 5 * k):
            kind = i % 5
            if kind == 0:
                props[f"s{i}"] = {"type": "string", "maxLength": 12}
            elif kind == 1:
                props[f"n{i}"] = {"type": "integer", "minimum": 0, "maximum": 999}
            elif kind == 2:
                props[f"b{i}"] = {"type": "boolean"}
            elif kind == 3:
                props[f"e{i}"] = {"enum": ["red", "green", "blue"]}
            else:
                props[f"o{i}"] = {
                    "type": "object",
                    "properties": {
                        "x": {"type": "number"},
                        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
                    },
                    "required": ["x"],
                }
        out.append({"type": "object", "properties": props, "required": list(props)})
    return out


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _walk(first_allowed: Callable[[], int | None], accept: Callable[[int], object], steps: int) -> tuple[int, float]:
    n, t = 0, 0.0
    for _ in range(steps):
        t0 = time.perf_counter()
        tok = first_allowed()
        t += time.perf_counter() - t0
        if tok is None:
            break
        accept(tok)
        n += 1
    return n, t


def bench_llguidance(tok: BpeTokenizer, eos: int) -> dict[str, float]:
    """llguidance: LLTokenizer from the byte strings, LLMatcher per schema."""
    import llguidance
    import llguidance.numpy as lln
    from kael.constraints._backend import ll_tokenizer

    t0 = time.perf_counter()
    lt = ll_tokenizer(tok, eos)
    setup = time.perf_counter() - t0
    comp = mask = 0.0
    steps = 0
    for s in schemas():
        t0 = time.perf_counter()
        m = llguidance.LLMatcher(lt, llguidance.LLMatcher.grammar_from_json_schema(json.dumps(s)))
        comp += time.perf_counter() - t0
        bm = lln.allocate_token_bitmask(1, lt.vocab_size)

        def first() -> int | None:
            lln.fill_next_token_bitmask(m, bm, 0)
            bits = np.unpackbits(bm[0].view(np.uint8), bitorder="little")
            ids = np.flatnonzero(bits[: lt.vocab_size])
            return None if m.is_stopped() or ids.size == 0 else int(ids[0])

        n, t = _walk(first, m.consume_token, 200)
        steps, mask = steps + n, mask + t
    return {"setup_s": setup, "compile_ms": comp * 1e3, "mask_us_per_token": mask / max(steps, 1) * 1e6}


def bench_xgrammar(tok: BpeTokenizer, eos: int) -> dict[str, float]:
    """xgrammar: TokenizerInfo (raw byte vocabulary), GrammarCompiler, GrammarMatcher."""
    import xgrammar as xgr

    t0 = time.perf_counter()
    vocab = [tok.token_bytes(i) for i in range(tok.vocab_size)]
    info = xgr.TokenizerInfo(vocab, vocab_type=xgr.VocabType.RAW, stop_token_ids=[eos])
    compiler = xgr.GrammarCompiler(info, cache_enabled=False)
    setup = time.perf_counter() - t0
    comp = mask = 0.0
    steps = 0
    for s in schemas():
        t0 = time.perf_counter()
        g = compiler.compile_json_schema(json.dumps(s))
        comp += time.perf_counter() - t0
        m = xgr.GrammarMatcher(g)
        bm = xgr.allocate_token_bitmask(1, info.vocab_size)

        def first() -> int | None:
            if m.is_terminated():
                return None
            m.fill_next_token_bitmask(bm)
            bits = np.unpackbits(bm[0].numpy().view(np.uint8), bitorder="little")
            ids = np.flatnonzero(bits[: info.vocab_size])
            return None if m.is_terminated() or ids.size == 0 else int(ids[0])

        n, t = _walk(first, m.accept_token, 200)
        steps, mask = steps + n, mask + t
    return {"setup_s": setup, "compile_ms": comp * 1e3, "mask_us_per_token": mask / max(steps, 1) * 1e6}


def bench_outlines(tok: BpeTokenizer, eos: int) -> dict[str, float]:
    """outlines-core: Vocabulary, Index per schema regex (the whole DFA at compile), Guide."""
    import outlines_core as oc
    from outlines_core.json_schema import build_regex_from_schema

    t0 = time.perf_counter()
    mp: dict[bytes, list[int]] = {}
    for i in range(tok.vocab_size):
        if i != eos:
            mp.setdefault(tok.token_bytes(i), []).append(i)
    vocab = oc.Vocabulary(eos, mp)
    setup = time.perf_counter() - t0
    comp = mask = 0.0
    steps = 0
    for s in schemas()[:4]:  # the DFA build grows fast; four schemas are enough to see it
        t0 = time.perf_counter()
        index = oc.Index(build_regex_from_schema(json.dumps(s)), vocab)
        comp += time.perf_counter() - t0
        g = oc.Guide(index)

        def first() -> int | None:
            ids = g.get_tokens()
            return None if g.is_finished() or not ids else int(min(ids))

        n, t = _walk(first, g.advance, 200)
        steps, mask = steps + n, mask + t
    return {"setup_s": setup, "compile_ms(4 schemas)": comp * 1e3, "mask_us_per_token": mask / max(steps, 1) * 1e6}


def main() -> None:
    """Print one JSON line of figures per library."""
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--only", choices=["llguidance", "xgrammar", "outlines"])
    p.add_argument("--batch", action="store_true", help="then the engine's batch-of-8 figures (structured_batch.py)")
    a, rest = p.parse_known_args()
    tok = BpeTokenizer.from_directory(_TOK_DIR)
    eos = tok.eot_token
    for name, fn in (("llguidance", bench_llguidance), ("xgrammar", bench_xgrammar), ("outlines", bench_outlines)):
        if a.only and a.only != name:
            continue
        before = _rss_mb()
        r = fn(tok, eos)
        r["peak_rss_growth_mb"] = _rss_mb() - before
        print(json.dumps({"library": name, **{k: round(v, 3) for k, v in r.items()}}), flush=True)
    if a.batch:
        import sys

        import structured_batch

        sys.argv = [sys.argv[0], *[x for x in rest if x != "--"]]
        structured_batch.main()


if __name__ == "__main__":
    main()
