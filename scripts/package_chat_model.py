"""Package a checkpoint written by examples/train_llama.py as the bundled kael-tiny-chat model.

    python scripts/package_kael_tiny.py CHECKPOINT_DIR --chat [--command "how it was trained"]

(``package_kael_tiny.py --chat`` calls ``package`` here.) Copies the model files into
kael_server/src/kael_server/models/kael-tiny-chat/ and writes its README.md from the
checkpoint's trainer.json, with the packaged model's answers (greedy and sampled) to a few
requests: common stdlib method names and functions the standard library does not have.
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path
from typing import Any

import kael
from kael.models import from_pretrained, read_generation_config
from kael.tokenizer import load_tokenizer

__all__ = ["COMMAND", "DEST", "FILES", "REQUESTS", "answer", "package", "readme"]

ROOT = Path(__file__).resolve().parent.parent
DEST = ROOT / "kael_server" / "src" / "kael_server" / "models" / "kael-tiny-chat"
FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")
COMMAND = "KAEL_NUM_THREADS=1 python examples/train_llama.py --out DIR --minutes 20"
# (request, what it is): a trained function, held-out ones, and plain ones.
REQUESTS = (
    ("Write a Python function `__repr__(self)`.", "a common method (many in training)"),
    ("Write a Python function `add(a, b)`.", "not in the standard library"),
    ("Write a Python function `is_even(n)` that does this:\nReturn True if n is even.", "not in the standard library"),
    ("Write a Python function `copy(self)`.", "a common method"),
)


def answer(model: Any, tok: Any, eos: tuple[int, ...], request: str, seed: int, temperature: float) -> str:
    """The model's reply to one user message (sampled with ``seed``; greedy at temperature 0)."""
    text = tok.chat_template.render([{"role": "user", "content": request}], add_generation_prompt=True)
    ids = tok.encode(text)  # the template's special tokens become their ids
    room = model.max_positions - len(ids)
    gen = kael.Generator().manual_seed(seed)
    out = model.generate(
        ids, max(1, room), temperature=temperature, top_k=40, generator=gen, on_token=lambda t: t not in eos
    )
    out = [t for t in out if t not in eos]
    return str(tok.decode_text(out))


def readme(directory: Path, state: dict[str, Any], command: str) -> str:
    cfg = state.get("config", {})
    model: Any = from_pretrained(directory)
    tok = load_tokenizer(directory)
    eos = read_generation_config(directory).eos_token_ids
    params = sum(p.numel() for p in model.parameters())
    size = (directory / "model.safetensors").stat().st_size
    loss = state["held_out_loss"]
    history = "\n".join(
        f"| {h['step']} | {h['seconds']:.0f} | {h['held_out_loss']:.4f} |" for h in state.get("history", [])
    )
    shown = []
    for i, (request, what) in enumerate(REQUESTS):
        greedy = answer(model, tok, eos, request, i, 0.0)
        sampled = answer(model, tok, eos, request, i, 0.7)
        shown.append(
            f"\n**User** ({what}): {request!r}\n\nGreedy:\n\n```python\n{greedy}\n```\n\n"
            f"Temperature 0.7, top-k 40:\n\n```python\n{sampled}\n```\n"
        )
    hosted = (
        " The installed C++ build then had no grouped-query attention kernel, so the script repeated"
        " the 2 K/V heads to 4 before calling it (the same attention, more memory)."
        if state.get("host_attention")
        else ""
    )
    conv = state.get("conversations", {})
    return f"""# kael-tiny-chat

A Llama-architecture chat model trained by kael itself (`examples/train_llama.py`, on the CPU
backend, one thread of this repository's 2-core machine, shared with other work) on
conversations made from the CPython standard library that ships with Python 3.11 (PSF
License; test directories excluded): the user asks for a function, by its signature or by
its docstring's first paragraph, and the assistant answers with the function's source. The
loss is on the assistant's tokens only. kael-server serves it as `kael-server --data kael-tiny-chat`,
on `/v1/chat/completions`; transformers loads it too (`AutoModelForCausalLM`, `AutoTokenizer`).

**What to expect:** a model of {params / 1e6:.1f} M parameters trained for {state["seconds"] / 60:.0f} minutes.
It has learned the shape of the task (reply with a `def` of the requested name, Python-looking
code, stop with `<|im_end|>`), not to program: bodies are plausible-looking stdlib fragments,
usually wrong. It is a test fixture and a demonstration that the whole path (training,
tokenizer, chat template, checkpoint, serving) works, not a useful assistant.

| | |
|---|---|
| architecture | Llama: {cfg.get("layers")} layers, hidden {cfg.get("hidden")}, MLP {cfg.get("intermediate")}, {cfg.get("heads")} heads, {cfg.get("kv_heads")} K/V heads (grouped-query), context {cfg.get("context")}, RMSNorm, rotary embeddings, SwiGLU, tied embeddings |
| tokenizer | byte-level BPE trained with `tokenizers` on the training split: {cfg.get("vocab")} tokens, special `<|endoftext|>` (0), `<|im_start|>` (1), `<|im_end|>` (2); ChatML chat template in tokenizer_config.json; generation_config.json stops at `<|im_end|>` and `<|endoftext|>` |
| data | {conv.get("training", 0):,} training conversations, {conv.get("held_out", 0):,} held out (functions of up to {cfg.get("max_chars")} characters; files split 95/5 by path hash as for kael-tiny) |
| parameters | {params:,} ({size / 1e6:.1f} MB of float32 safetensors) |
| training | {state["step"]:,} steps of {cfg.get("batch_size")} x {cfg.get("context")} tokens ({state["tokens"]:,} tokens, rows starting at a conversation), AdamW (lr {cfg.get("lr")}, betas 0.9/0.95, weight decay 0.1), cosine schedule with warm-up |
| training time | {state["seconds"] / 60:.1f} minutes (wall clock, one thread, on a machine shared with other jobs).{hosted} |
| held-out loss | **{loss:.4f} nats/token** on the assistant tokens of held-out conversations |

Reproduce: `{command}`, then `python scripts/package_kael_tiny.py DIR --chat`.

## Held-out loss during training

| step | seconds | held-out loss |
|---|---|---|
{history}

## Answers
{"".join(shown)}"""


def package(checkpoint: Path, state: dict[str, Any], command: str) -> str:
    """Copy the model files of ``checkpoint`` into DEST and write its README; return the README."""
    DEST.mkdir(parents=True, exist_ok=True)
    for name in FILES:
        shutil.copyfile(checkpoint / name, DEST / name)
    text = readme(DEST, state, command)
    (DEST / "README.md").write_text(text, encoding="utf-8")
    assert math.isfinite(state["held_out_loss"])
    return text
