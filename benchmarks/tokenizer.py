"""Tokenizer encode throughput: kael's BpeTokenizer against tiktoken (when installed).

Builds a few MB of mixed text in the script (the reference cases, which include
Unicode and emoji, plus Python source from the standard library), encodes it with
each tokenizer and prints JSON with MB/s (UTF-8 bytes per second; best of a few
runs, after a warm-up run that fills the piece caches) and whether the ids agree.
tiktoken needs network access to fetch its GPT-2 files, so it is skipped when it
is missing or cannot load them.

    python benchmarks/tokenizer.py [--megabytes 4] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

from kael.tokenizer import BpeTokenizer

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data" / "gpt2-tokenizer"


def build_text(megabytes: float) -> str:
    """Mixed text: the reference cases (prose, Unicode, emoji) and stdlib Python source."""
    cases = [json.loads(line)["text"] for line in (DATA / "cases.jsonl").open(encoding="utf-8")]
    prose = "\n".join(cases)
    stdlib = Path(os.__file__).parent
    sources = []
    for path in sorted(stdlib.glob("*.py")):
        sources.append(path.read_text(encoding="utf-8", errors="replace"))
        if sum(map(len, sources)) > megabytes * 1e6 / 2:
            break
    code = "\n".join(sources)
    text = "\n".join([prose] * max(1, round(megabytes * 1e6 / 2 / len(prose.encode())))) + code
    return text


def measure(encode: Callable[[str], list[int]], text: str, repeats: int) -> tuple[float, list[int]]:
    ids = encode(text)  # warm-up (fills caches)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        encode(text)
        best = min(best, time.perf_counter() - start)
    return len(text.encode("utf-8")) / 1e6 / best, ids


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megabytes", type=float, default=4.0)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    text = build_text(args.megabytes)
    start = time.perf_counter()
    tokenizer = BpeTokenizer.from_directory(DATA)
    load_s = time.perf_counter() - start

    cold_tokenizer = BpeTokenizer.from_directory(DATA)
    start = time.perf_counter()
    cold_tokenizer.encode(text)
    cold_mb_s = len(text.encode("utf-8")) / 1e6 / (time.perf_counter() - start)

    kael_mb_s, kael_ids = measure(tokenizer.encode, text, args.repeats)
    report: dict[str, object] = {
        "benchmark": "tokenizer_encode",
        "python": sys.version.split()[0],
        "text_megabytes": round(len(text.encode("utf-8")) / 1e6, 3),
        "tokens": len(kael_ids),
        "kael_load_s": round(load_s, 4),
        "kael_encode_cold_mb_s": round(cold_mb_s, 2),
        "kael_encode_mb_s": round(kael_mb_s, 2),
    }
    try:
        import tiktoken

        encoding = tiktoken.get_encoding("gpt2")
    except Exception as error:  # missing, or no network for its files
        report["tiktoken"] = f"skipped: {type(error).__name__}: {error}"[:200]
    else:
        tiktoken_mb_s, tiktoken_ids = measure(encoding.encode_ordinary, text, args.repeats)
        report["tiktoken_encode_mb_s"] = round(tiktoken_mb_s, 2)
        report["kael_over_tiktoken"] = round(kael_mb_s / tiktoken_mb_s, 3)
        report["ids_match_tiktoken"] = tiktoken_ids == kael_ids
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
