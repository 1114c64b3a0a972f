"""Prometheus metrics of one server, in a registry of its own (so apps and tests never share counts)."""

from __future__ import annotations

import sys
import threading

try:
    import resource
except ImportError:  # Windows
    resource = None  # type: ignore[assignment]

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

__all__ = ["CONSTRAINT_REFUSALS", "OUTCOMES", "Metrics", "peak_memory_bytes"]

OUTCOMES = ("ok", "busy", "rejected", "error", "cancelled", "timeout")
"""``timeout``: the request ran past ``--request-timeout`` (504, or a stream's final error event)."""
REQUEST_BUCKETS = (0.1, 0.5, 1, 2, 5, 10, 30, 60, 120)
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
BATCH_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
QUEUE_WAIT_BUCKETS = (0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
MASK_BUCKETS = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 5e-2)
COMPILE_BUCKETS = (1e-4, 1e-3, 5e-3, 0.01, 0.05, 0.1, 0.5, 1, 5)
CONSTRAINT_REFUSALS = ("invalid", "compile")
"""Why a request's constraint was refused (400): a malformed, over-limit or conflicting
constraint field, or a grammar the library could not compile."""


def peak_memory_bytes() -> int:
    """Peak resident set size of this process: ru_maxrss is in KiB on Linux, in bytes on macOS
    (0 where there is no getrusage)."""
    if resource is None:
        return 0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss) if sys.platform == "darwin" else int(rss) * 1024


class Metrics:
    """The server's counters, gauges and histograms; every method is safe from any thread."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "kael_requests",
            "Generation requests (/generate, /v1/completions, /v1/chat/completions), each counted once by outcome "
            "(timeout: ended by --request-timeout).",
            ["status"],
            registry=r,
        )
        for outcome in OUTCOMES:
            self.requests.labels(outcome)
        self.generated_tokens = Counter("kael_generated_tokens", "Tokens generated.", registry=r)
        self.prompt_tokens = Counter("kael_prompt_tokens", "Prompt tokens accepted.", registry=r)
        self.tokens_per_second = Gauge(
            "kael_tokens_per_second", "Generation speed of the last finished generation.", registry=r
        )
        self.in_flight = Gauge(
            "kael_requests_in_flight",
            "Generation requests being answered now (in every slot, queued, or still streaming).",
            registry=r,
        )
        self.request_seconds = Histogram(
            "kael_request_seconds",
            "Wall time of generation requests, arrival to last byte, any outcome.",
            buckets=REQUEST_BUCKETS,
            registry=r,
        )
        self.time_to_first_token = Histogram(
            "kael_time_to_first_token_seconds",
            "From a request's arrival to its first generated token.",
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.batch_size = Histogram(
            "kael_batch_size",
            "Sequences decoded together in one step of the batch scheduler (--slots > 1).",
            buckets=BATCH_BUCKETS,
            registry=r,
        )
        self.queue_depth = Gauge("kael_queue_depth", "Requests waiting for a generation slot.", registry=r)
        self.queue_wait = Histogram(
            "kael_queue_wait_seconds",
            "From admission to a generation slot (0 when one was free), or to giving up waiting.",
            buckets=QUEUE_WAIT_BUCKETS,
            registry=r,
        )
        peak = Gauge("kael_peak_memory_bytes", "Peak resident memory of the server process.", registry=r)
        peak.set_function(peak_memory_bytes)
        # The paged KV cache (--kv-cache-tokens) and its prefix cache (kael.models.PagedKVCache).
        self.kv_blocks_total = Gauge("kael_kv_blocks_total", "Blocks of the paged KV cache.", registry=r)
        self.kv_blocks_used = Gauge(
            "kael_kv_blocks_used", "KV cache blocks held by sequences being decoded.", registry=r
        )
        self.kv_blocks_cached = Gauge(
            "kael_kv_blocks_cached",
            "KV cache blocks held by no sequence but kept for prefix reuse (evicted least recently used first).",
            registry=r,
        )
        self.prefix_queries = Counter(
            "kael_prefix_cache_queries_tokens", "Prompt tokens looked up in the prefix cache.", registry=r
        )
        self.prefix_hits = Counter(
            "kael_prefix_cache_hits_tokens",
            "Prompt tokens whose keys and values came from the prefix cache (not computed).",
            registry=r,
        )
        self.kv_evictions = Counter("kael_kv_evictions", "Cached KV blocks evicted to make room.", registry=r)
        self.preemptions = Counter(
            "kael_preemptions",
            "Sequences preempted when the KV cache ran out of blocks (freed, then recomputed later).",
            registry=r,
        )
        # Structured outputs (kael.constraints): masks, compiles, refusals.
        self.mask_seconds = Histogram(
            "kael_constraint_mask_seconds",
            "Time to compute and apply one constrained row's token mask, per step.",
            buckets=MASK_BUCKETS,
            registry=r,
        )
        self.compile_seconds = Histogram(
            "kael_constraint_compile_seconds",
            "Time to compile a request's constraint (JSON schema, regex, choice, grammar) when not cached.",
            buckets=COMPILE_BUCKETS,
            registry=r,
        )
        self.compile_cache_hits = Counter(
            "kael_constraint_compile_cache_hits", "Constraints found already compiled (cached by text).", registry=r
        )
        self.constraint_refusals = Counter(
            "kael_constraint_refusals",
            "Requests refused (400) for a constraint kael cannot enforce, by reason.",
            ["reason"],
            registry=r,
        )
        for reason in CONSTRAINT_REFUSALS:
            self.constraint_refusals.labels(reason)
        # Speculative decoding (--speculative): draft tokens proposed and confirmed.
        self.spec_proposed = Counter(
            "kael_spec_draft_tokens", "Draft tokens proposed for verification (--speculative).", registry=r
        )
        self.spec_accepted = Counter(
            "kael_spec_accepted_tokens", "Draft tokens the model confirmed (the same token sampled).", registry=r
        )
        self.spec_acceptance = Gauge(
            "kael_spec_acceptance_rate", "Accepted over proposed draft tokens since the server started.", registry=r
        )
        self._spec_last = (0, 0)
        self._kv_last = {"prefix_query_tokens": 0, "prefix_hit_tokens": 0, "evictions": 0}
        self._kv_lock = threading.Lock()

    def request_finished(self, outcome: str, seconds: float) -> None:
        """Counts one finished generation request under ``outcome`` (one of ``OUTCOMES``) in ``kael_requests``
        and observes its wall time, arrival to last byte, in ``kael_request_seconds``."""
        self.requests.labels(outcome).inc()
        self.request_seconds.observe(seconds)

    def generation_finished(self, tokens: int, seconds: float, ttft: float | None) -> None:
        """Records one finished generation: adds its ``tokens`` to ``kael_generated_tokens``, sets
        ``kael_tokens_per_second`` to ``tokens / seconds`` (left as it was for no tokens or no time) and
        observes the time to the first token, ``ttft`` (None when there was none), in its histogram."""
        self.generated_tokens.inc(tokens)
        if tokens and seconds > 0:
            self.tokens_per_second.set(tokens / seconds)
        if ttft is not None:
            self.time_to_first_token.observe(ttft)

    def constraint_compiled(self, seconds: float, cache_hit: bool) -> None:
        """Records one constraint compile: a cache hit, or its time in ``kael_constraint_compile_seconds``."""
        if cache_hit:
            self.compile_cache_hits.inc()
        else:
            self.compile_seconds.observe(seconds)

    def constraint_refused(self, reason: str) -> None:
        """Counts one request refused for its constraint (``reason``: one of ``CONSTRAINT_REFUSALS``)."""
        self.constraint_refusals.labels(reason).inc()

    def kv_observe(self, stats: dict[str, int]) -> None:
        """Sets the KV cache gauges and advances its counters from a ``BatchDecoder.kv_stats()``
        snapshot (cumulative counts; empty without a paged cache)."""
        if not stats:
            return
        with self._kv_lock:
            self.kv_blocks_total.set(stats["blocks_total"])
            self.kv_blocks_used.set(stats["blocks_used"])
            self.kv_blocks_cached.set(stats["blocks_cached"])
            last = self._kv_last
            for key, counter in (
                ("prefix_query_tokens", self.prefix_queries),
                ("prefix_hit_tokens", self.prefix_hits),
                ("evictions", self.kv_evictions),
            ):
                delta = stats[key] - last[key]
                if delta > 0:
                    counter.inc(delta)
                last[key] = stats[key]

    def spec_observe(self, proposed: int, accepted: int) -> None:
        """Advances the speculative-decoding counters to the cumulative ``proposed`` and
        ``accepted`` draft tokens (a ``kael.engine.Speculator``'s) and sets the acceptance rate."""
        with self._kv_lock:
            last_p, last_a = self._spec_last
            if proposed > last_p:
                self.spec_proposed.inc(proposed - last_p)
            if accepted > last_a:
                self.spec_accepted.inc(accepted - last_a)
            self._spec_last = (proposed, accepted)
            if proposed:
                self.spec_acceptance.set(accepted / proposed)

    def render(self) -> bytes:
        """Every metric of this registry in Prometheus' text exposition format (served as ``content_type``)."""
        return generate_latest(self.registry)
