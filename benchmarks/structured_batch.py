"""Constrained decoding in a batch (issue 30): 8 requests decoded together by kael's engine
(``EngineCore`` over a ``BatchDecoder``), each under a JSON schema, against the same 8
unconstrained, on GPT-2 small and on a SmolLM2-135M-shaped Llama (30 layers, 576 wide, 9 heads,
3 K/V heads; GPT-2's 50257-token vocabulary so one tokenizer serves both), random weights.

Prints JSON: aggregate tok/s of each run and their ratio (goal >= 0.9x), the grammar's mask time
per token per row and its share of a decode step (goal < 5%), and compile times of ten schemas
of increasing size. Every row runs to ``--new-tokens`` (the schema is an open-ended list, so no
row ends early and both runs decode the same number of tokens).

Run: ``python benchmarks/structured_batch.py [--threads 2] [--new-tokens 48] [--repeats 3]`` (each
configuration runs ``--repeats`` times, alternating, and the best run of each is reported).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = ["main", "run_batch"]

_TOK_DIR = Path(__file__).resolve().parents[1] / "tests" / "data" / "gpt2-tokenizer"

SCHEMA: dict[str, Any] = {
    "type": "array",
    "minItems": 64,
    "items": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 12},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 3},
            "active": {"type": "boolean"},
        },
        "required": ["name", "age", "tags", "active"],
        "additionalProperties": False,
    },
}
"""An open-ended list of records: no row can finish before its token budget."""


def _smollm2_shaped(directory: Path) -> None:
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=50257,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        max_position_embeddings=2048,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        bos_token_id=50256,
        eos_token_id=50256,
    )
    transformers.LlamaForCausalLM(config).save_pretrained(directory, safe_serialization=True)


def run_batch(model: Any, tok: Any, *, rows: int, new_tokens: int, constrained: bool) -> dict[str, float]:
    """Decode ``rows`` seeded requests together; tok/s over the whole run and over decode steps,
    and (constrained) the summed mask seconds."""
    import kael
    from kael.constraints import json_schema
    from kael.engine import EngineCore, Request, SamplingParams, TokenSampler
    from kael.models import BatchDecoder

    eos = tok.eot_token
    constraint = json_schema(SCHEMA) if constrained else None
    params = SamplingParams(max_tokens=new_tokens, temperature=1.0, seed=None, constraint=constraint)
    masks: list[float] = []
    core = EngineCore.on(BatchDecoder(model, rows=rows))
    prompts = [tok.encode(f"Record {i}: a list of people, as JSON:") for i in range(rows)]
    for i, prompt in enumerate(prompts):
        sampler = TokenSampler(params, prompt, kael.Generator().manual_seed(i), end_tokens=[eos], tokenizer=tok)
        if sampler.matcher is not None:
            sampler.matcher.on_mask = masks.append
        core.add(Request(prompt, params, eos_ids=[eos], sampler=sampler))
    start = time.perf_counter()
    first: float | None = None
    produced = steps = 0
    while core.has_unfinished:
        events = core.step()
        produced += sum(len(e.tokens) for e in events)
        if first is None and produced:
            first = time.perf_counter()
        else:
            steps += 1
    end = time.perf_counter()
    assert first is not None
    decode_tokens = produced - rows
    return {
        "tokens": produced,
        "tok_s": produced / (end - start),
        "decode_tok_s": decode_tokens / (end - first),
        "decode_step_ms": 1e3 * (end - first) / max(steps, 1),
        "mask_us_per_token_row": 1e6 * sum(masks) / max(len(masks), 1),
    }


def compile_times(tok: Any) -> list[dict[str, float]]:
    """Compile seconds (first use: no cache) of the ten schemas of ``structured.schemas``."""
    from kael.constraints import ConstraintMatcher, json_schema
    from structured import schemas

    out = []
    for s in schemas():
        start = time.perf_counter()
        ConstraintMatcher(json_schema(s), tok, tok.eot_token).allowed()
        out.append({"schema_bytes": len(json.dumps(s)), "compile_ms": 1e3 * (time.perf_counter() - start)})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=48)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--models", nargs="+", default=["gpt2-small", "smollm2-135m-shaped"])
    args = ap.parse_args()

    import kael
    from gpt2 import write_checkpoint
    from kael.models import from_pretrained
    from kael.tokenizer import BpeTokenizer

    kael.set_num_threads(args.threads)
    tok = BpeTokenizer.from_directory(_TOK_DIR)
    from kael.constraints import ConstraintMatcher, json_schema

    ConstraintMatcher(json_schema({"type": "object"}), tok, tok.eot_token)  # the vocabulary index, once
    report: dict[str, Any] = {"rows": args.rows, "new_tokens": args.new_tokens, "threads": args.threads}
    report["kael_backend"] = kael.backends.current("cpu").name
    report["compile"] = compile_times(tok)
    for name in args.models:
        with tempfile.TemporaryDirectory() as d:
            if name == "gpt2-small":
                write_checkpoint(Path(d))
            else:
                _smollm2_shaped(Path(d))
            model = from_pretrained(d)
            run_batch(model, tok, rows=args.rows, new_tokens=4, constrained=True)  # warm up
            runs: dict[bool, list[dict[str, float]]] = {False: [], True: []}
            for _ in range(args.repeats):  # alternated, the best of each (a shared machine is noisy)
                for constrained in (False, True):
                    runs[constrained].append(
                        run_batch(model, tok, rows=args.rows, new_tokens=args.new_tokens, constrained=constrained)
                    )
            plain, schema = (max(runs[c], key=lambda r: r["tok_s"]) for c in (False, True))
        report[name] = {
            "unconstrained": plain,
            "json_schema": schema,
            "tok_s_ratio": schema["tok_s"] / plain["tok_s"],
            "decode_tok_s_ratio": schema["decode_tok_s"] / plain["decode_tok_s"],
            "mask_share_of_decode_step": schema["mask_us_per_token_row"] / (1e3 * plain["decode_step_ms"]),
        }
        print(json.dumps({name: report[name]}), flush=True)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
