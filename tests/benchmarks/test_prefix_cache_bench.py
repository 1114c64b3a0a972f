"""benchmarks/prefix_cache.py runs on a tiny random GPT-2 and reports what it measured (no timing judged)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "prefix_cache.py"


def test_prefix_cache_benchmark_reports_hits_and_capacity() -> None:
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--model", "2,2,64,256", "--threads", "1", "--repeats", "1", "--prefix", "100"],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    report = json.loads(out.stdout)
    ttft = report["ttft"]
    # 6 whole blocks of 16 and 4 slots of the 7th (NOTE [partial block])
    assert ttft["prefix_tokens"] == 100 and ttft["cached_tokens_per_hit"] == 100
    assert ttft["miss_ms"] > 0 and ttft["hit_ms"] > 0
    cap = report["capacity"]
    # 8 rows of the 256-token context = 2048 positions = 128 blocks; a 64-token sequence takes 4.
    assert cap["kv_blocks"] == 128 and cap["concurrent_sequences"] == 32
    assert cap["blocks_used_at_end"] == 128
