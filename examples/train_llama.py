"""Train a small Llama-architecture chat model with kael on functions of the CPython standard library.

Each conversation asks for one function of this Python's own stdlib (PSF licence; nothing is
downloaded) and answers with its source, in ChatML::

    <|im_start|>user
    Write a Python function `name(args)`.<|im_end|>
    <|im_start|>assistant
    def name(args):
        ...<|im_end|>

(or the request quotes the function's docstring instead of its signature). The loss is on
the assistant's tokens only (its answer and the closing ``<|im_end|>``). The tokenizer is
a byte-level BPE trained here with the ``tokenizers`` library on the training split; files
are split 95/5 by a hash of their path, as examples/train_gpt.py splits them, so the
held-out loss is on functions of files the model never saw.

    KAEL_NUM_THREADS=1 python examples/train_llama.py --out kael-tiny-chat --minutes 20

The output directory is a Hugging Face checkpoint (config.json, model.safetensors,
tokenizer.json, tokenizer_config.json with the chat template, generation_config.json) that
kael.models.from_pretrained, kael-server and transformers load, plus trainer.json (the
run's settings and held-out loss history).
"""

from __future__ import annotations

import argparse
import ast
import glob
import hashlib
import itertools
import json
import math
import os
import sys
import sysconfig
import textwrap
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import kael
import numpy as np
from kael import nn, optim
from kael.models.llama import LlamaConfig, LlamaForCausalLM, save_pretrained

__all__ = [
    "CHAT_TEMPLATE",
    "SPECIAL_TOKENS",
    "Example",
    "conversations",
    "encode_examples",
    "main",
    "stdlib_functions",
    "train_tokenizer",
    "write_tokenizer_files",
]

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")  # ids 0, 1, 2
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
IGNORE = -100


@dataclass(frozen=True)
class Example:
    """One conversation: the user's request and the function's source (the assistant's answer)."""

    path: str
    request: str
    answer: str
    held_out: bool


def _held_out(rel: str) -> bool:
    return hashlib.sha1(rel.encode()).digest()[0] < 13  # about 5% of the files, as train_gpt.py


def stdlib_functions(max_chars: int) -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef, str]]:
    """``(relative path, def node, dedented source)`` of every function of the stdlib (tests excluded)."""
    root = sysconfig.get_paths()["stdlib"]
    files = sorted(
        f
        for f in glob.glob(os.path.join(root, "**", "*.py"), recursive=True)
        if "site-packages" not in f and os.sep + "test" not in f[len(root) :]
    )
    for path in files:
        try:
            with open(path, encoding="utf-8") as fh:
                text = fh.read()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                tree = ast.parse(text)
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        rel = os.path.relpath(path, root)
        lines = text.encode("utf-8").splitlines(keepends=True)  # ast offsets count UTF-8 bytes
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno is not None:
                first, last = lines[node.lineno - 1], lines[node.end_lineno - 1]
                # Only a def that has its lines to itself (nothing before it or after it on them).
                if first[: node.col_offset].strip() or last[node.end_col_offset or 0 :].strip():
                    continue
                raw = b"".join(lines[node.lineno - 1 : node.end_lineno])
                if len(raw) > 2 * max_chars:
                    continue
                source = textwrap.dedent(raw.decode("utf-8")).rstrip() + "\n"
                if len(source) <= max_chars:
                    yield rel, node, source


def _request(node: ast.FunctionDef | ast.AsyncFunctionDef, rel: str) -> str:
    """Ask by signature, or (for half of the documented functions) by the docstring's first paragraph."""
    signature = f"{node.name}({ast.unparse(node.args)})"
    doc = ast.get_docstring(node)
    if doc and hashlib.sha1(f"{rel}:{node.name}".encode()).digest()[0] % 2:
        first = doc.strip().split("\n\n")[0].strip()
        return f"Write a Python function `{node.name}` that does this:\n{first}"
    return f"Write a Python function `{signature}`."


def conversations(max_chars: int, limit: int | None = None) -> list[Example]:
    """The conversations of the first ``limit`` (default all) usable stdlib functions."""
    found = itertools.islice(stdlib_functions(max_chars), limit)
    return [Example(rel, _request(node, rel), source, _held_out(rel)) for rel, node, source in found]


def prompt_text(request: str) -> str:
    """The chat template's rendering of one user message with the generation prompt."""
    return f"<|im_start|>user\n{request}<|im_end|>\n<|im_start|>assistant\n"


def train_tokenizer(examples: list[Example], vocab_size: int) -> Any:
    """A byte-level BPE (GPT-2's pre-tokenizer) with the three special tokens, trained on the texts."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator((prompt_text(e.request) + e.answer + "<|im_end|>\n" for e in examples), trainer)
    return tok


def write_tokenizer_files(tok: Any, directory: str, context: int) -> None:
    """tokenizer.json, tokenizer_config.json (ChatML template) and special_tokens_map.json."""
    tok.save(os.path.join(directory, "tokenizer.json"))
    added = {
        str(tok.token_to_id(t)): {
            "content": t,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for t in SPECIAL_TOKENS
    }
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": added,
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "model_max_length": context,
    }
    with open(os.path.join(directory, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2)
        f.write("\n")


def encode_examples(tok: Any, examples: list[Example], context: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One token stream of whole conversations: (ids, loss targets shifted by one, conversation starts).

    ``targets[i]`` is ``ids[i + 1]`` where that token is the assistant's (answer or closing
    ``<|im_end|>``), IGNORE elsewhere. Conversations longer than ``context`` tokens are dropped.
    """
    ids: list[int] = []
    mask: list[bool] = []
    starts: list[int] = []
    for e in examples:
        prompt = tok.encode(prompt_text(e.request)).ids
        answer = tok.encode(e.answer + "<|im_end|>").ids
        tail = tok.encode("\n").ids
        if len(prompt) + len(answer) + len(tail) > context:
            continue
        starts.append(len(ids))
        ids += prompt + answer + tail
        mask += [False] * len(prompt) + [True] * len(answer) + [False] * len(tail)
    arr = np.array(ids, dtype=np.int64)
    targets = np.full(len(arr), IGNORE, dtype=np.int64)
    m = np.array(mask[1:] + [False])
    targets[:-1][m[:-1]] = arr[1:][m[:-1]]
    return arr, targets, np.array(starts, dtype=np.int64)


def batch(
    data: tuple[np.ndarray, np.ndarray, np.ndarray], batch_size: int, ctx: int, rng: np.random.Generator
) -> tuple[kael.Tensor, kael.Tensor]:
    """Rows of ``ctx`` tokens, each starting at a conversation's first token (later ones follow it)."""
    ids, targets, starts = data
    usable = starts[starts + ctx <= len(ids)]
    chosen = rng.choice(usable, size=batch_size)
    x = np.stack([ids[s : s + ctx] for s in chosen])
    y = np.stack([targets[s : s + ctx] for s in chosen])
    return kael.from_numpy(x), kael.from_numpy(y)


def loss_of(model: LlamaForCausalLM, x: kael.Tensor, y: kael.Tensor) -> kael.Tensor:
    logits = model(x)
    b, t, v = logits.shape
    return nn.functional.cross_entropy(logits.reshape(b * t, v), y.reshape(b * t), ignore_index=IGNORE)


def evaluate(model: LlamaForCausalLM, data: Any, batches: int, batch_size: int, ctx: int) -> float:
    model.eval()
    rng = np.random.default_rng(1234)
    total = 0.0
    with kael.no_grad():
        for _ in range(batches):
            x, y = batch(data, batch_size, ctx, rng)
            total += float(loss_of(model, x, y).item())
    model.train()
    return total / batches


def save(model: LlamaForCausalLM, tok: Any, state: dict[str, Any], out: str, context: int) -> None:
    os.makedirs(out, exist_ok=True)
    save_pretrained(model, out)
    write_tokenizer_files(tok, out, context)
    eos = [tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")]
    generation = {"eos_token_id": eos, "pad_token_id": tok.token_to_id("<|endoftext|>"), "max_new_tokens": 200}
    for name, obj in (("generation_config.json", generation), ("trainer.json", state)):
        tmp = os.path.join(out, name + ".tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(obj, f, indent=1)
            f.write("\n")
        os.replace(tmp, os.path.join(out, name))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--out", default="kael-tiny-chat", help="checkpoint directory")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--intermediate", type=int, default=352)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--context", type=int, default=256)
    p.add_argument("--vocab", type=int, default=2048)
    p.add_argument("--max-chars", type=int, default=800, help="longest function source to use")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--warmup", type=int, default=50, help="steps of linear learning-rate warm-up")
    p.add_argument("--steps", type=int, default=None, help="stop after this many steps")
    p.add_argument("--minutes", type=float, default=20.0, help="stop after this much training time")
    p.add_argument("--limit", type=int, default=None, help="use only the first N conversations (tests)")
    p.add_argument("--eval-every", type=int, default=250)
    p.add_argument("--eval-batches", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.steps is not None and args.steps < 1:
        p.error(f"--steps must be at least 1, got {args.steps}")

    examples = conversations(args.max_chars, args.limit)
    train_ex = [e for e in examples if not e.held_out]
    held_ex = [e for e in examples if e.held_out]
    if not train_ex or not held_ex:
        print(f"error: {len(train_ex)} training and {len(held_ex)} held-out conversations; need both", file=sys.stderr)
        return 2
    tok = train_tokenizer(train_ex, args.vocab)
    train = encode_examples(tok, train_ex, args.context)
    held = encode_examples(tok, held_ex, args.context)
    for name, data in (("training", train), ("held-out", held)):
        if not (data[2] + args.context <= len(data[0])).any():
            print(f"error: the {name} split holds fewer than --context {args.context} tokens", file=sys.stderr)
            return 2
    print(
        f"corpus: {len(train[2]):,} training conversations ({len(train[0]):,} tokens), "
        f"{len(held[2]):,} held-out ({len(held[0]):,} tokens); vocabulary {tok.get_vocab_size():,}",
        file=sys.stderr,
    )
    kael.manual_seed(args.seed)
    eos = (tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>"))
    config = LlamaConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=args.hidden,
        intermediate_size=args.intermediate,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        max_position_embeddings=args.context,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        eos_token_id=eos,
    )
    model = LlamaForCausalLM(config)
    model.train()
    params = list(model.parameters())
    opt = optim.AdamW(
        [
            {"params": [q for q in params if q.ndim >= 2], "weight_decay": 0.1},
            {"params": [q for q in params if q.ndim < 2], "weight_decay": 0.0},
        ],
        lr=args.lr,
        betas=(0.9, 0.95),
    )
    n_params = sum(q.numel() for q in params)
    print(f"model: {n_params:,} parameters", file=sys.stderr)
    state: dict[str, Any] = {"step": 0, "seconds": 0.0, "tokens": 0, "history": []}
    warmup, budget = args.warmup, args.minutes * 60
    rng = np.random.default_rng(args.seed)
    start = time.perf_counter()
    step = 0
    last_step = args.steps if args.steps is not None else math.inf
    while step < last_step:
        elapsed = time.perf_counter() - start
        if elapsed >= budget:
            break
        frac = min(1.0, step / args.steps) if args.steps is not None else min(1.0, elapsed / budget)
        lr = args.lr * min(1.0, (step + 1) / warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        for g in opt.param_groups:
            g["lr"] = lr
        x, y = batch(train, args.batch_size, args.context, rng)
        loss = loss_of(model, x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        step += 1
        state["tokens"] += args.batch_size * args.context
        if step % 50 == 0:
            now = time.perf_counter() - start
            print(
                f"step {step} loss {float(loss.item()):.3f} lr {lr:.2e} {state['tokens'] / now:,.0f} tok/s",
                file=sys.stderr,
            )
        if step % args.eval_every == 0:
            now = time.perf_counter() - start
            ev = evaluate(model, held, args.eval_batches, args.batch_size, args.context)
            state["history"].append({"step": step, "seconds": round(now, 1), "held_out_loss": round(ev, 4)})
            print(f"step {step}: held-out loss {ev:.4f} (assistant tokens)", file=sys.stderr)
            state.update(step=step, seconds=now)
            save(model, tok, state, args.out, args.context)
    now = time.perf_counter() - start
    ev = evaluate(model, held, args.eval_batches * 2, args.batch_size, args.context)
    state.update(
        step=step,
        seconds=now,
        held_out_loss=ev,
        parameters=n_params,
        conversations={"training": len(train[2]), "held_out": len(held[2])},
        corpus_tokens={"training": len(train[0]), "held_out": len(held[0])},
        config={
            "layers": args.layers,
            "hidden": args.hidden,
            "intermediate": args.intermediate,
            "heads": args.heads,
            "kv_heads": args.kv_heads,
            "context": args.context,
            "vocab": tok.get_vocab_size(),
            "batch_size": args.batch_size,
            "lr": args.lr,
            "max_chars": args.max_chars,
        },
    )
    save(model, tok, state, args.out, args.context)
    print(json.dumps({"steps": step, "seconds": round(now, 1), "held_out_loss": round(ev, 4), "parameters": n_params}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
