"""``python -m kael generate`` (kael/models/_cli.py): greedy text of the tiny reference checkpoint,
streaming through the incremental UTF-8 decoder (never half a character), stopping at
<|endoftext|>, and clean errors.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import kael
import numpy as np
import pytest
from kael.__main__ import main
from kael.models._cli import fit_prompt, stream_generation

DATA = Path(__file__).resolve().parent.parent / "data"
REF = json.loads((DATA / "tiny-gpt2" / "reference.json").read_text())
CASE = REF["cases"][0]  # "Hello world"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("tiny-gpt2-with-tokenizer")
    for name in ("config.json", "model.safetensors"):
        shutil.copy(DATA / "tiny-gpt2" / name, d / name)
    for name in ("vocab.json", "merges.txt"):
        shutil.copy(DATA / "gpt2-tokenizer" / name, d / name)
    return d


@pytest.fixture(scope="module")
def tokenizer(model_dir: Path) -> Any:
    return kael.BpeTokenizer.from_directory(model_dir)


class Recorder:
    """A text stream that keeps each write separately."""

    encoding = "utf-8"

    def __init__(self) -> None:
        self.writes: list[str] = []

    def write(self, s: str) -> int:
        self.writes.append(s)
        return len(s)

    def flush(self) -> None:
        pass


class ScriptedModel:
    """Generates a fixed token list, honouring on_token like GPT.generate."""

    def __init__(self, tokens: list[int]) -> None:
        self.tokens = tokens

    def generate(
        self,
        prompt: list[int],
        max_new_tokens: int,
        temperature: float = 0.0,
        top_k: int = 0,
        on_token: Any = None,
        generator: Any = None,
    ) -> list[int]:
        out = []
        for t in self.tokens[:max_new_tokens]:
            out.append(t)
            if on_token is not None and on_token(t) is False:
                break
        return out


def test_greedy_output_matches_the_reference(
    model_dir: Path, tokenizer: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    assert tokenizer.encode(CASE["prompt"]) == CASE["ids"]
    rc = main(["generate", "--model", str(model_dir), CASE["prompt"], "--max-tokens", "20"])
    out, err = capsys.readouterr()
    assert rc == 0 and err == ""
    assert out == tokenizer.decode_text(CASE["greedy_20"]) + "\n"


def test_speculative_gives_the_reference_text(
    model_dir: Path, tokenizer: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = main(["generate", "--model", str(model_dir), CASE["prompt"], "--max-tokens", "20", "--speculative", "ngram"])
    out, err = capsys.readouterr()
    assert rc == 0 and err == ""
    assert out == tokenizer.decode_text(CASE["greedy_20"]) + "\n"
    seeded = ["generate", "--model", str(model_dir), "Once upon", "--max-tokens", "8", "--temperature", "0.9"]
    seeded += ["--seed", "3"]
    assert main(seeded) == 0
    plain = capsys.readouterr().out
    assert main([*seeded, "--speculative", "ngram"]) == 0
    assert capsys.readouterr().out == plain


def test_a_draft_model_gives_the_reference_text(
    model_dir: Path, tokenizer: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--speculative draft --draft-model DIR``: the model drafting for itself (every draft accepted) and
    the stored greedy reference text; bad flag combinations are one-line errors naming the flag."""
    base = ["generate", "--model", str(model_dir), CASE["prompt"], "--max-tokens", "20"]
    rc = main([*base, "--speculative", "draft", "--draft-model", str(model_dir), "--spec-tokens", "3"])
    out, err = capsys.readouterr()
    assert rc == 0 and err == ""
    assert out == tokenizer.decode_text(CASE["greedy_20"]) + "\n"
    for extra, message in (
        (["--speculative", "draft"], "--speculative draft needs --draft-model"),
        (["--draft-model", str(model_dir)], "--draft-model needs --speculative draft"),
        (["--speculative", "ngram", "--spec-tokens", "0"], "--spec-tokens must be an integer in 1..15, got 0"),
        (["--speculative", "ngram", "--spec-tokens", "100"], "--spec-tokens must be an integer in 1..15, got 100"),
    ):
        assert main([*base, *extra]) == 1
        out, err = capsys.readouterr()
        assert out == "" and err.strip() == f"error: {message}" or message in err, (extra, err)


def test_sampling_is_reproducible_with_a_seed(model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = [
        "generate",
        "--model",
        str(model_dir),
        "Once upon",
        "--max-tokens",
        "8",
        "--temperature",
        "0.9",
        "--top-k",
        "50",
        "--seed",
        "11",
    ]
    assert main(args) == 0
    first = capsys.readouterr().out
    assert main(args) == 0
    assert capsys.readouterr().out == first


def test_multibyte_characters_are_never_split(tokenizer: Any) -> None:
    text = "naïve 😀 日本語 🎉!"
    ids = tokenizer.encode(text)
    assert any(
        tokenizer.decode([i]).decode("utf-8", "replace") != tokenizer.decode([i]).decode("utf-8", "ignore") for i in ids
    )  # some tokens hold only part of a character
    out = Recorder()
    got = stream_generation(ScriptedModel(ids), tokenizer, [1], len(ids), out)
    assert got == ids
    assert "".join(out.writes) == text
    assert all("\ufffd" not in w for w in out.writes)
    assert len(out.writes) > 3  # streamed, not written at the end


def test_generation_stops_at_end_of_text(tokenizer: Any) -> None:
    hello, world = tokenizer.encode("Hello"), tokenizer.encode(" world")
    out = Recorder()
    got = stream_generation(ScriptedModel(hello + [tokenizer.eot_token] + world), tokenizer, [1], 10, out)
    assert got == hello + [tokenizer.eot_token]
    assert "".join(out.writes) == "Hello"


def test_errors_are_reported_cleanly(model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["generate", "--model", str(tmp_path / "missing"), "Hi"]) == 1
    assert "error:" in capsys.readouterr().err
    assert main(["generate", "--model", str(model_dir), "Hi", "--temperature", "0.0001"]) == 1
    assert "temperature" in capsys.readouterr().err
    assert main(["generate", "--model", str(model_dir), "Hi", "--max-tokens", "-2"]) == 1
    assert "--max-tokens" in capsys.readouterr().err
    only_model = tmp_path / "no-tokenizer"
    only_model.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(model_dir / name, only_model / name)
    assert main(["generate", "--model", str(only_model), "Hi"]) == 1
    assert "vocab.json" in capsys.readouterr().err


def test_python_dash_m_streams_utf8(model_dir: Path, tokenizer: Any) -> None:
    env = dict(
        os.environ,
        PYTHONIOENCODING="ascii",
        PYTHONPATH=os.pathsep.join(
            [str(Path(kael.__file__).resolve().parent.parent), os.environ.get("PYTHONPATH", "")]
        ),
    )
    r = subprocess.run(
        [sys.executable, "-m", "kael", "generate", "--model", str(model_dir), CASE["prompt"], "--max-tokens", "20"],
        capture_output=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert r.returncode == 0, r.stderr.decode()
    # U+FFFD (a byte token that is no character) arrives as UTF-8 even on an ASCII stdout
    assert r.stdout.decode("utf-8") == tokenizer.decode_text(CASE["greedy_20"]) + "\n"


def test_a_prompt_longer_than_the_context_is_refused(
    model_dir: Path, tokenizer: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    context = json.loads((model_dir / "config.json").read_text())["n_positions"]
    prompt = "Hello world, " * context  # well over the context in GPT-2 tokens
    n = len(tokenizer.encode(prompt))
    assert n > context
    assert main(["generate", "--model", str(model_dir), prompt, "--max-tokens", "4"]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err == (
        f"error: the prompt is {n} tokens, more than the model's context of {context} tokens; "
        f"shorten it, or pass --truncate-prompt to keep its last {context} tokens\n"
    )


def test_truncate_prompt_keeps_the_last_context_tokens(
    model_dir: Path, tokenizer: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    context = json.loads((model_dir / "config.json").read_text())["n_positions"]
    prompt = "Once upon a time " * context
    ids = tokenizer.encode(prompt)
    args = ["generate", "--model", str(model_dir), prompt, "--max-tokens", "6", "--truncate-prompt"]
    assert main(args) == 0
    out, err = capsys.readouterr()
    assert err == ""
    # Oracle: the same model, given only the prompt's last `context` ids.
    model = kael.models.from_pretrained(model_dir)
    expected = model.generate(ids[-context:], 6)
    if tokenizer.eot_token in expected:
        expected = expected[: expected.index(tokenizer.eot_token)]
    assert out == tokenizer.decode_text(expected) + "\n"


def test_fit_prompt() -> None:
    assert fit_prompt([1, 2, 3], 3) == [1, 2, 3]
    assert fit_prompt([1, 2, 3, 4], 3, truncate=True) == [2, 3, 4]
    with pytest.raises(kael.KaelError, match="the prompt is 4 tokens, more than the model's context of 3"):
        fit_prompt([1, 2, 3, 4], 3)


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert (
        capsys.readouterr().out.strip()
        == f"kael {kael.__version__} (Python {platform.python_version()}, NumPy {np.__version__})"
    )
    r = subprocess.run([sys.executable, "-m", "kael", "--version"], capture_output=True, text=True, timeout=120)
    assert (r.returncode, r.stdout.strip()) == (
        0,
        f"kael {kael.__version__} (Python {platform.python_version()}, NumPy {np.__version__})",
    )


def test_generation_stops_at_every_generation_config_eos_id(
    model_dir: Path, tmp_path: Path, tokenizer: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    greedy = CASE["greedy_20"]
    stop = greedy[3]
    cut = greedy.index(stop)
    directory = tmp_path / "with-generation-config"
    shutil.copytree(model_dir, directory)
    (directory / "generation_config.json").write_text(json.dumps({"eos_token_id": [tokenizer.eot_token, stop]}))
    assert main(["generate", "--model", str(directory), CASE["prompt"], "--max-tokens", "20"]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    assert out == tokenizer.decode_text(greedy[:cut]) + "\n"


def test_a_tokenizer_json_checkpoint_generates_the_same_text(
    model_dir: Path, tmp_path: Path, tokenizer: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """GPT-2's tokenizer saved by transformers as tokenizer.json alone (load_tokenizer's first choice)."""
    pytest.importorskip("transformers")
    from hf_fixtures import write_gpt2

    directory = write_gpt2(tmp_path / "gpt2-tokenizer-json")
    for name in ("vocab.json", "merges.txt"):
        (directory / name).unlink()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(model_dir / name, directory / name)
    assert isinstance(kael.tokenizer.load_tokenizer(directory), kael.tokenizer.HFTokenizer)
    assert main(["generate", "--model", str(directory), CASE["prompt"], "--max-tokens", "20"]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    assert out == tokenizer.decode_text(CASE["greedy_20"]) + "\n"
