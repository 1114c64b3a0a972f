"""Benchmark the paged KV cache (issue #20): prefix-cache hits, and sequences per byte of KV memory.

    python benchmarks/prefix_cache.py                      # GPT-2 small, random weights, 2 threads
    python benchmarks/prefix_cache.py --model 4,4,256 --threads 1 --repeats 2   # a small model, quick

Two measurements on kael's ``BatchDecoder`` (what kael-server's batch scheduler drives), one JSON
object printed:

* ``ttft``: time to first token (the prefill of the prompt and its first token's logits) of a
  768-token shared prefix plus a 16-token suffix, as a miss (an engine without prefix caching:
  every position computed) and as a hit (the prefix's 48 blocks cached by an earlier request
  with another suffix: only the suffix computed); best of ``--repeats``; the ratio miss/hit
  (issue #20's goal: at least 8).
* ``capacity``: how many 64-token sequences (a 32-token prompt and 32 generated tokens, all
  distinct) run at once in the KV memory of ``--slots 8`` rows of the full 1024-token context
  (8192 positions: 512 blocks of 16), all decoded together to the end with no preemption
  (the goal: at least 32; eight full rows would hold 8), and their decode tokens/s.

The model is built in memory with random weights (nothing is downloaded or written).
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import numpy as np


def build(spec: str, seed: int = 0) -> Any:
    import kael

    if spec == "small":
        layers, heads, dim, ctx = 12, 12, 768, 1024
    else:
        parts = [int(p) for p in spec.split(",")]
        layers, heads, dim = parts[:3]
        ctx = parts[3] if len(parts) > 3 else 1024
    return kael.models.GPT(50257, ctx, layers, heads, dim, generator=kael.Generator().manual_seed(seed))


def ttft(model: Any, repeats: int, prefix_len: int, suffix_len: int) -> dict[str, Any]:
    from kael.models import BatchDecoder

    rng = np.random.default_rng(1)
    prefix = [int(t) for t in rng.integers(0, model.vocab_size, prefix_len)]

    def suffix() -> list[int]:
        return [int(t) for t in rng.integers(0, model.vocab_size, suffix_len)]

    def first_token(engine: BatchDecoder, prompt: list[int]) -> float:
        t0 = time.perf_counter()
        engine.greedy(kael_view(engine.prefill(0, prompt)))
        dt = time.perf_counter() - t0
        engine.release(0)
        return dt

    cold = BatchDecoder(model, 1, prefix_caching=False)
    warm = BatchDecoder(model, 1)
    first_token(warm, prefix + suffix())  # fills the cache with the prefix's blocks
    miss = min(first_token(cold, prefix + suffix()) for _ in range(repeats))
    hits = []
    for _ in range(repeats):
        hits.append(first_token(warm, prefix + suffix()))
    hit = min(hits)
    cached = warm.kv_stats()["prefix_hit_tokens"] // repeats
    return {
        "prefix_tokens": prefix_len,
        "suffix_tokens": suffix_len,
        "cached_tokens_per_hit": cached,
        "miss_ms": round(miss * 1e3, 2),
        "hit_ms": round(hit * 1e3, 2),
        "miss_over_hit": round(miss / hit, 2),
    }


def kael_view(logits: Any) -> Any:
    import kael

    return kael.reshape(logits, (1, -1))


def capacity(model: Any, slots: int, prompt_len: int, new_tokens: int, max_rows: int) -> dict[str, Any]:
    from kael.models import BatchDecoder, KVCacheFull

    memory = slots * model.max_positions  # what --slots N of full contexts would hold
    engine = BatchDecoder(model, max_rows, kv_cache_tokens=memory, prefix_caching=False)
    rng = np.random.default_rng(2)
    seq_tokens = prompt_len + new_tokens
    rows: list[int] = []
    last: list[int] = []
    t0 = time.perf_counter()
    need = -(-seq_tokens // engine.block_size)
    reserved = 0
    for r in range(max_rows):
        # Admit a sequence only if it can run to its end alongside the others with no preemption.
        if engine.cache.num_blocks - reserved < need:
            break
        prompt = [int(t) for t in rng.integers(0, model.vocab_size, prompt_len)]
        try:
            logits = engine.prefill(r, prompt)
        except KVCacheFull:
            break
        rows.append(r)
        last.append(engine.greedy(kael_view(logits))[0])
        reserved += need  # the blocks it will hold at its end (the pool hands them out as it grows)
    prefill_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    steps = 0
    for _ in range(new_tokens - 1):
        logits = engine.decode(rows, last)
        last = engine.greedy(logits)
        steps += 1
    decode_s = time.perf_counter() - t1
    assert engine.preemptions == 0
    assert all(engine.length(r) == seq_tokens - 1 for r in rows)
    return {
        "kv_memory_tokens": memory,
        "kv_blocks": engine.cache.num_blocks,
        "full_context_rows_in_that_memory": slots,
        "sequence_tokens": seq_tokens,
        "concurrent_sequences": len(rows),
        "blocks_used_at_end": engine.kv_stats()["blocks_used"],
        "prefill_s": round(prefill_s, 2),
        "decode_tokens_per_s": round(len(rows) * steps / decode_s, 1) if decode_s > 0 else None,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="small", help="small, or LAYERS,HEADS,DIMENSION[,CONTEXT] (random weights)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--prefix", type=int, default=768)
    ap.add_argument("--suffix", type=int, default=16)
    ap.add_argument("--slots", type=int, default=8, help="full-context rows whose memory the capacity test gets")
    ap.add_argument("--sequence", type=int, nargs=2, default=(32, 32), metavar=("PROMPT", "NEW"))
    ap.add_argument("--max-rows", type=int, default=256)
    args = ap.parse_args()
    import kael

    kael.set_num_threads(args.threads)
    model = build(args.model)
    model.eval()
    backend = kael._dispatch.backend_for("cpu").name
    report: dict[str, Any] = {"model": args.model, "threads": args.threads, "backend": backend}
    with kael.no_grad():
        report["ttft"] = ttft(model, args.repeats, min(args.prefix, model.max_positions - args.suffix - 1), args.suffix)
        report["capacity"] = capacity(model, args.slots, args.sequence[0], args.sequence[1], args.max_rows)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
