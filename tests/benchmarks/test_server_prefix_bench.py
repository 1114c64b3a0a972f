"""benchmarks/server.py --prefix: a default kael-server reports the repeated prefix as cached (no timing judged).

The oracle is the block arithmetic: a 100-token prefix followed by 16 other tokens shares its 6
whole blocks of 16 (96 tokens) with the first request, and a fresh random prefix shares none.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "server.py"


@pytest.mark.e2e
def test_a_default_server_reports_the_repeated_prefix_as_cached() -> None:
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--prefix", "100", "--random-gpt2", "2,2,64,256", "--streams", "2"],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    report = json.loads(out.stdout)
    assert report["prefix_tokens"] == 100 and report["rounds"] == 2
    assert report["cached_tokens_on_hit"] == [100, 100]  # 6 whole blocks of 16, 4 slots of the 7th
    assert len(report["ttft_miss_s"]) == len(report["ttft_hit_s"]) == 2
    assert report["ttft_miss_median_s"] > 0 and report["ttft_hit_median_s"] > 0


def test_prefix_mode_refuses_load_and_llama_server() -> None:
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--prefix", "100", "--load", "--random-gpt2", "2,2,64"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2 and "--prefix N (N >= 1) measures kael-server alone" in out.stderr
