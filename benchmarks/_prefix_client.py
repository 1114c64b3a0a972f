"""The client side of benchmarks/server.py's ``--prefix`` mode: time to first token of a repeated prefix.

Issue #27 asks that a default kael-server (no flags) reuse a repeated prompt's cached prefix:
``cached_tokens`` in the usage, and the first token at least 5x sooner than the first time
(a 768-token shared prefix on GPT-2 small). Each round sends a fresh random prefix of token
ids twice, with two different suffixes: the first request computes every position (a miss),
the second only what follows the cached blocks (a hit). A request asks for one token, not
streamed, so its wall time is its time to first token (prefill, one sampled token, HTTP).
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import httpx
import numpy as np

__all__ = ["one_token", "measure_prefix"]

VOCAB = 50257  # GPT-2's vocabulary: the random prefixes are its token ids


def one_token(client: httpx.Client, model: str, ids: list[int]) -> tuple[float, int]:
    """Seconds to answer a one-token completion of token ids ``ids``, and its ``cached_tokens``."""
    body = {"model": model, "prompt": ids, "max_tokens": 1, "temperature": 0}
    start = time.perf_counter()
    response = client.post("/v1/completions", json=body)
    elapsed = time.perf_counter() - start
    response.raise_for_status()
    details = response.json()["usage"].get("prompt_tokens_details") or {}
    return elapsed, int(details.get("cached_tokens") or 0)


def measure_prefix(url: str, prefix_tokens: int, suffix_tokens: int, rounds: int, seed: int = 0) -> dict[str, Any]:
    """``rounds`` miss/hit pairs on fresh random prefixes; medians and the miss/hit ratio."""
    rng = np.random.default_rng(seed)
    misses: list[float] = []
    hits: list[float] = []
    cached: list[int] = []
    with httpx.Client(base_url=url, timeout=600) as client:
        model = client.get("/v1/models").json()["data"][0]["id"]
        one_token(client, model, [int(t) for t in rng.integers(0, VOCAB, 8)])  # warm-up: first-request costs
        for _ in range(rounds):
            prefix = [int(t) for t in rng.integers(0, VOCAB, prefix_tokens)]
            first, first_cached = one_token(
                client, model, prefix + [int(t) for t in rng.integers(0, VOCAB, suffix_tokens)]
            )
            second, second_cached = one_token(
                client, model, prefix + [int(t) for t in rng.integers(0, VOCAB, suffix_tokens)]
            )
            if first_cached:
                raise RuntimeError(f"a fresh random prefix reported {first_cached} cached tokens")
            misses.append(first)
            hits.append(second)
            cached.append(second_cached)
    miss, hit = statistics.median(misses), statistics.median(hits)
    return {
        "prefix_tokens": prefix_tokens,
        "suffix_tokens": suffix_tokens,
        "rounds": rounds,
        "ttft_miss_s": [round(t, 4) for t in misses],
        "ttft_hit_s": [round(t, 4) for t in hits],
        "cached_tokens_on_hit": cached,
        "ttft_miss_median_s": round(miss, 4),
        "ttft_hit_median_s": round(hit, 4),
        "miss_over_hit": round(miss / hit, 2) if hit > 0 else None,
    }
