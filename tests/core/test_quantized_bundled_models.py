"""The bundled models with quantized weights: kael-tiny's and kael-tiny-chat's held-out loss in Q8_0 and
Q4_0 against the figures their READMEs measured (the same held-out text, batches and seed as
examples/train_gpt.py and examples/train_llama.py), and ``python -m kael generate`` / ``chat`` with
``--weights``.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from kael.quant import QuantizedLinear
from quantized_models_common import from_pretrained

pytest.importorskip("gguf")
pytest.importorskip("torch")
pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[2]


# -- the bundled models' held-out loss (the READMEs' measurement) ----------------------------------
def _example(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / "examples" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def test_kael_tiny_held_out_loss_in_q8_0_and_q4_0() -> None:
    """kael-tiny's README: 0.8797 nats/byte on the held-out files (train_gpt.py's final evaluate:
    16 batches of 16 x 128 from a 12 MB corpus, seed 1234). Q8_0 may add at most 0.5%, Q4_0 3%."""
    pytest.importorskip("tqdm")
    from kael_server.loading import bundled_model_dir

    train_gpt = _example("train_gpt")
    _, held = train_gpt.load_corpus(int(12.0 * 1e6))
    d = bundled_model_dir("kael-tiny")
    loss = {w: train_gpt.evaluate(from_pretrained(d, weights=w), held, 16, 16, 128) for w in (None, "q8_0", "q4_0")}
    assert loss[None] == pytest.approx(0.8797, abs=5e-5)  # the README's figure: the same text
    assert loss["q8_0"] <= loss[None] * 1.005
    assert loss["q4_0"] <= loss[None] * 1.03
    assert loss["q4_0"] != loss[None]  # the weights really changed


def test_kael_tiny_chat_held_out_loss_in_q8_0_and_q4_0() -> None:
    """kael-tiny-chat's README: 2.6741 nats/token on the assistant tokens of the held-out
    conversations (train_llama.py's final evaluate: 16 batches of 16 x 256, seed 1234)."""
    pytest.importorskip("tqdm")
    tokenizers = pytest.importorskip("tokenizers")
    from kael_server.loading import bundled_model_dir

    train_llama = _example("train_llama")
    d = bundled_model_dir("kael-tiny-chat")
    tok = tokenizers.Tokenizer.from_file(str(d / "tokenizer.json"))
    held = train_llama.encode_examples(tok, [e for e in train_llama.conversations(800) if e.held_out], 256)
    loss = {w: train_llama.evaluate(from_pretrained(d, weights=w), held, 16, 16, 256) for w in (None, "q8_0", "q4_0")}
    assert loss[None] == pytest.approx(2.6741, abs=5e-5)
    assert loss["q8_0"] <= loss[None] * 1.005
    assert loss["q4_0"] <= loss[None] * 1.03
    assert loss["q4_0"] != loss[None]


# -- python -m kael generate / chat --weights ----------------------------------------------------------
def test_cli_generate_with_weights(capsys: pytest.CaptureFixture[str]) -> None:
    from kael.__main__ import main
    from kael.models._cli import stop_ids
    from kael.tokenizer import load_tokenizer
    from kael_server.loading import bundled_model_dir

    d = bundled_model_dir("kael-tiny")
    tok = load_tokenizer(d)
    model = from_pretrained(d, weights="q4_0")
    ids = model.generate(tok.encode("def "), 24)
    stops = stop_ids(model, tok)
    cut = next((i for i, t in enumerate(ids) if t in stops), len(ids))
    assert main(["generate", "--model", str(d), "--weights", "q4_0", "--max-tokens", "24", "def "]) == 0
    assert capsys.readouterr().out == tok.decode_text(ids[:cut]) + "\n"
    with pytest.raises(SystemExit) as info:
        main(["generate", "--model", str(d), "--weights", "q7_0", "x"])
    assert info.value.code == 2
    assert "invalid choice: 'q7_0'" in capsys.readouterr().err


def test_cli_chat_with_weights(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    from kael.__main__ import main
    from kael.models import _registry
    from kael_server.loading import bundled_model_dir

    loaded: list[Any] = []
    real = _registry.from_pretrained

    def spy(*args: Any, **kwargs: Any) -> Any:
        loaded.append(real(*args, **kwargs))
        return loaded[-1]

    monkeypatch.setattr(_registry, "from_pretrained", spy)
    d = bundled_model_dir("kael-tiny-chat")
    monkeypatch.setattr(sys, "stdin", io.StringIO("Write a Python function `add(a, b)`.\n"))
    assert main(["chat", "--model", str(d), "--weights", "q8_0", "--max-tokens", "16"]) == 0
    assert capsys.readouterr().out.strip()
    assert [m.weights_scheme for m in loaded] == ["q8_0"]
    assert isinstance(loaded[0].model.layers[0].self_attn.q_proj, QuantizedLinear)
