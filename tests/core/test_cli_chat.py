"""``python -m kael chat`` (kael/models/_cli.py): a conversation read from piped stdin, each reply
streamed to stdout, on a random Llama (tokenizer.json, ChatML template) and a random GPT-2 (GPT-2's
vocabulary, a template in tokenizer_config.json).

Oracle for each turn: transformers' ``apply_chat_template`` of the whole history so far (ids),
then ``kael.models.generate`` on those ids, cut at the stop ids (the tokenizer's eos, the
generation_config eos ids, the template's end of turn), decoded; the reply joins the history.
"""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
from argparse import Namespace
from pathlib import Path

import kael
import pytest
from hf_fixtures import GPT2_DATA, write_byte_level
from kael.models._cli import chat_cli, stop_ids

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

CHATML = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
GPT2_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] + ': ' + m['content'] + '\\n\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ 'assistant:' }}{% endif %}"
)


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = write_byte_level(tmp_path_factory.mktemp("chat") / "tiny-llama", chat_template=CHATML)
    vocab = kael.tokenizer.load_tokenizer(directory).vocab_size
    config = transformers.LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=vocab,
        max_position_embeddings=256,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    with torch.no_grad():  # weights larger than the default init: clear-cut greedy tokens
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.2)
    model.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("chat") / "tiny-gpt2"
    kael.GPT(50257, 128, 2, 2, 32, generator=kael.Generator().manual_seed(1)).save_pretrained(directory)
    for name in ("vocab.json", "merges.txt"):
        shutil.copyfile(GPT2_DATA / name, directory / name)
    (directory / "tokenizer_config.json").write_text(json.dumps({"chat_template": GPT2_TEMPLATE}))
    return directory


def hf_ids(directory: Path, messages: list[dict[str, str]]) -> list[int]:
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    out = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return [int(i) for i in (out if isinstance(out, list) else out["input_ids"])]


def conversation_oracle(directory: Path, lines: list[str], max_tokens: int, system: str | None = None) -> list[str]:
    """Each turn's reply as the chat must print it (a line of input per turn; /reset honoured)."""
    model = kael.models.from_pretrained(directory)
    tokenizer = kael.tokenizer.load_tokenizer(directory)
    stops = set(stop_ids(model, tokenizer, tokenizer.chat_template))
    start = [{"role": "system", "content": system}] if system else []
    history, replies = list(start), []
    for line in lines:
        if line == "/reset":
            history = list(start)
            continue
        history.append({"role": "user", "content": line})
        ids = hf_ids(directory, history)
        new = kael.models.generate(model, ids, min(max_tokens, model.max_positions - len(ids)))
        cut = next((i for i, t in enumerate(new) if t in stops), len(new))
        replies.append(tokenizer.decode_text(new[:cut]))
        history.append({"role": "assistant", "content": replies[-1]})
    return replies


def run_chat(directory: Path, stdin: str, *flags: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "kael", "chat", "--model", str(directory), *flags]
    return subprocess.run(command, input=stdin, capture_output=True, text=True, timeout=300, encoding="utf-8")


@pytest.mark.parametrize("which", ["llama", "gpt2"])
def test_piped_conversation_prints_each_greedy_reply(which: str, request: pytest.FixtureRequest) -> None:
    directory = request.getfixturevalue(f"{which}_dir")
    lines = ["Hello world, how are you?", "def fibonacci(n):", "/reset", "Hello world, how are you?"]
    result = run_chat(directory, "\n".join(lines) + "\n", "--max-tokens", "12", "--system", "Be brief.")
    assert result.returncode == 0, result.stderr
    replies = conversation_oracle(directory, lines, 12, system="Be brief.")
    assert result.stdout == "".join(reply + "\n" for reply in replies)
    assert replies[0] == replies[2]  # /reset: the same first turn again
    assert "(conversation cleared)" in result.stderr


def test_exit_ends_the_chat_and_sampling_is_seeded(gpt2_dir: Path) -> None:
    flags = ("--max-tokens", "6", "--temperature", "0.9", "--top-p", "0.8", "--seed", "4")
    first = run_chat(gpt2_dir, "Hi\n/exit\nnever read\n", *flags)
    again = run_chat(gpt2_dir, "Hi\n", *flags)
    assert first.returncode == again.returncode == 0
    assert first.stdout == again.stdout and first.stdout.count("\n") == 1


class Recorder(io.StringIO):
    """Keeps each write separately (a reply must arrive in pieces, not at the end)."""

    encoding = "utf-8"

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[str] = []

    def write(self, s: str) -> int:
        self.writes.append(s)
        return super().write(s)


def test_the_reply_is_streamed_as_it_is_generated(llama_dir: Path) -> None:
    args = Namespace(
        model=str(llama_dir), system=None, max_tokens=10, temperature=0.0, top_p=1.0, seed=None, device="cpu"
    )
    out, err = Recorder(), io.StringIO()
    assert chat_cli(args, inp=io.StringIO("Hello world\n"), out=out, err=err) == 0, err.getvalue()
    (reply,) = conversation_oracle(llama_dir, ["Hello world"], 10)
    assert out.getvalue() == reply + "\n"
    assert len([w for w in out.writes if w]) > 2


@pytest.mark.parametrize("speculative", ["ngram", "draft"])
def test_speculative_chat_replies_as_without_it(llama_dir: Path, speculative: str) -> None:
    """``chat --speculative``: greedy and seeded top-p replies (two turns) equal those without it; the
    draft model is the checkpoint itself."""
    lines = "Hello world\nSay it again: hello world hello world\n"
    base = dict(model=str(llama_dir), system=None, max_tokens=16, device="cpu")
    for sampling in (dict(temperature=0.0, top_p=1.0, seed=None), dict(temperature=0.8, top_p=0.9, seed=7)):
        plain_out, spec_out, err = io.StringIO(), io.StringIO(), io.StringIO()
        assert chat_cli(Namespace(**base, **sampling), inp=io.StringIO(lines), out=plain_out, err=err) == 0
        spec = dict(speculative=speculative, draft_model=str(llama_dir) if speculative == "draft" else None)
        args = Namespace(**base, **sampling, **spec, spec_tokens=4)
        assert chat_cli(args, inp=io.StringIO(lines), out=spec_out, err=err) == 0, err.getvalue()
        assert spec_out.getvalue() == plain_out.getvalue() and plain_out.getvalue().strip()


def test_a_checkpoint_without_a_chat_template_is_exit_code_2(tmp_path: Path, gpt2_dir: Path) -> None:
    for name in ("config.json", "model.safetensors", "vocab.json", "merges.txt"):
        shutil.copyfile(gpt2_dir / name, tmp_path / name)
    result = run_chat(tmp_path, "Hi\n")
    assert result.returncode == 2
    assert "has no chat template" in result.stderr and "chat_template.jinja" in result.stderr
    assert result.stdout == ""


def test_bad_flags_and_a_full_context_are_clear_errors(gpt2_dir: Path) -> None:
    assert run_chat(gpt2_dir, "", "--max-tokens", "0").returncode == 1
    bad = run_chat(gpt2_dir, "", "--top-p", "0")
    assert bad.returncode == 1 and "--top-p" in bad.stderr
    long = run_chat(gpt2_dir, "word " * 200 + "\nHi\n", "--max-tokens", "3")
    assert long.returncode == 0
    assert "leaves no room" in long.stderr and long.stdout.count("\n") == 1  # the short turn still answered


def test_generate_reads_a_tokenizer_json_checkpoint(llama_dir: Path) -> None:
    command = [sys.executable, "-m", "kael", "generate", "--model", str(llama_dir), "Hello world", "--max-tokens", "8"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, encoding="utf-8")
    assert result.returncode == 0, result.stderr
    model = kael.models.from_pretrained(llama_dir)
    tokenizer = kael.tokenizer.load_tokenizer(llama_dir)
    new = kael.models.generate(model, tokenizer.encode("Hello world"), 8)
    stops = set(stop_ids(model, tokenizer))
    cut = next((i for i, t in enumerate(new) if t in stops), len(new))
    assert result.stdout == tokenizer.decode_text(new[:cut]) + "\n"


class Interrupted(io.StringIO):
    """A terminal whose user presses Ctrl-C after the first message."""

    def __init__(self) -> None:
        super().__init__("Hi\n")
        self.lines = 0

    def readline(self, size: int | None = -1) -> str:
        self.lines += 1
        if self.lines > 1:
            raise KeyboardInterrupt
        return super().readline()


def test_ctrl_c_ends_the_chat_without_a_traceback(gpt2_dir: Path) -> None:
    args = Namespace(
        model=str(gpt2_dir), system=None, max_tokens=4, temperature=0.0, top_p=1.0, seed=None, device="cpu"
    )
    out, err = io.StringIO(), io.StringIO()
    assert chat_cli(args, inp=Interrupted(), out=out, err=err) == 130
    (reply,) = conversation_oracle(gpt2_dir, ["Hi"], 4)
    assert out.getvalue() == reply + "\n\n" and err.getvalue() == ""
