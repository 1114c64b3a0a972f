"""examples/train_llama.py: the conversations, the assistant-only loss targets and the split, then a
tiny run (a few steps) whose checkpoint kael and transformers both load, with the same logits
and the same chat-template ids.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "train_llama.py"
TINY = [
    *("--layers", "1", "--hidden", "32", "--intermediate", "48", "--heads", "4", "--kv-heads", "2"),
    *("--context", "128", "--vocab", "320", "--batch-size", "2", "--limit", "1500"),
]


@pytest.fixture(scope="module")
def train_llama() -> ModuleType:
    pytest.importorskip("kael")
    pytest.importorskip("tokenizers")
    spec = importlib.util.spec_from_file_location("train_llama", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["train_llama"] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def examples(train_llama: ModuleType) -> list[Any]:
    return list(train_llama.conversations(400, 1500))


def test_conversations_are_stdlib_functions(train_llama: ModuleType, examples: list[Any]) -> None:
    import ast

    assert len(examples) == 1500
    for e in examples[:200]:
        tree = ast.parse(e.answer)  # the answer is a whole function, dedented
        assert isinstance(tree.body[0], (ast.FunctionDef, ast.AsyncFunctionDef))
        assert f"`{tree.body[0].name}" in e.request and len(e.answer) <= 400
    # the split is by file: no file has conversations on both sides
    held = {e.path for e in examples if e.held_out}
    assert held and held.isdisjoint({e.path for e in examples if not e.held_out})


def test_loss_targets_are_the_assistant_tokens(train_llama: ModuleType, examples: list[Any]) -> None:
    tok = train_llama.train_tokenizer(examples[:300], 320)
    ids, targets, starts = train_llama.encode_examples(tok, examples[:20], 128)
    assert starts[0] == 0 and len(starts) <= 20
    im_end, im_start = tok.token_to_id("<|im_end|>"), tok.token_to_id("<|im_start|>")
    kept = targets != train_llama.IGNORE
    np.testing.assert_array_equal(targets[kept], ids[1:][kept[:-1]])  # targets are the next tokens
    # per conversation: the targets decode to exactly the answer plus <|im_end|>
    bounds = [*starts.tolist(), len(ids)]
    used = [e for e in examples[:20] if len(tok.encode(train_llama.prompt_text(e.request)).ids) < 128]
    for i, (a, b) in enumerate(zip(bounds, bounds[1:])):
        conv_targets = targets[a:b][targets[a:b] != train_llama.IGNORE]
        assert conv_targets[-1] == im_end and im_start not in conv_targets.tolist()
        text = tok.decode(conv_targets.tolist(), skip_special_tokens=False)
        assert text.endswith("<|im_end|>") and text.removesuffix("<|im_end|>") in {e.answer for e in used}, i


def test_tiny_run_writes_a_checkpoint_kael_and_transformers_load(
    train_llama: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    import kael

    out = tmp_path / "chat"
    assert train_llama.main([*TINY, "--steps", "3", "--eval-every", "2", "--eval-batches", "1", "--out", str(out)]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["steps"] == 3 and np.isfinite(summary["held_out_loss"])
    state = json.loads((out / "trainer.json").read_text())
    assert state["history"][0]["step"] == 2 and state["config"]["kv_heads"] == 2

    model = kael.models.from_pretrained(out)
    tok = kael.tokenizer.load_tokenizer(out)
    assert model.generation_config.eos_token_ids == (2, 0)  # <|im_end|>, <|endoftext|>
    messages = [{"role": "user", "content": "Write a Python function `add(a, b)`."}]
    hf_tok = transformers.AutoTokenizer.from_pretrained(out)
    want_ids = list(hf_tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)["input_ids"])
    text = tok.chat_template.render(messages, add_generation_prompt=True)
    assert text == train_llama.prompt_text(messages[0]["content"])
    assert tok.encode(text) == want_ids
    hf = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    with torch.no_grad():
        want = hf(torch.tensor([want_ids])).logits.numpy()
    with kael.no_grad():
        got = model(kael.tensor([want_ids])).numpy()
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-4)


def test_too_few_conversations_is_refused(train_llama: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    assert train_llama.main(["--limit", "3", "--out", "/nonexistent/never-written"]) == 2
    assert "held-out conversations; need both" in capsys.readouterr().err
