"""GGUF tokenizer metadata (kael/tokenizer/_gguf.py): ``tokenizer_from_gguf`` and ``tokenizer_to_gguf``.

Oracles: GPT-2's vocabulary written into a GGUF file by the ``gguf`` package's own writer,
laid out as llama.cpp's ``convert_hf_to_gguf.py`` lays it out (tokens by id, merges, the
control type on ``<|endoftext|>``, pre-tokenizer ``gpt-2``), read back by kael, must encode
as GPT-2's BPE (kael's ``BpeTokenizer``, itself tested against tiktoken's ranks) and as the
``tokenizers`` library's GPT-2 ``tokenizer.json``; tokenizers written by kael must read back
encoding as the original ``tokenizers`` pipelines do. llama.cpp's own tokenizer is compared
in ``test_gguf_llama_cpp.py`` (it needs a model file).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import kael
import pytest
from hf_fixtures import GPT2_DATA, write_byte_level, write_gpt2, write_llama2, write_llama3
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kael.tokenizer import BpeTokenizer, HFTokenizer, tokenizer_from_gguf, tokenizer_to_gguf

gguf = pytest.importorskip("gguf")

TEXTS = [
    "Hello, world!",
    "  leading spaces and   runs\n\n\ttabs\r\n",
    "It's 12345 o'clock; they'll say we've done it",
    "Ünïcödé tëxt, emoji 🙂🚀, 中文字符 and русский текст.",
    "def f(x):\n    return x ** 2  # square\n",
    "<|endoftext|>special in the middle<|endoftext|>",
    "",
]
KAEL_TINY_CHAT = (
    Path(__file__).resolve().parents[2] / "kael_server" / "src" / "kael_server" / "models" / "kael-tiny-chat"
)


@pytest.fixture(scope="module")
def gpt2_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """GPT-2's tokenizer in a GGUF file written by the gguf package, as convert_hf_to_gguf.py writes it."""
    vocab = json.loads((GPT2_DATA / "vocab.json").read_text(encoding="utf-8"))
    lines = (GPT2_DATA / "merges.txt").read_text(encoding="utf-8").splitlines()
    merges = [line for line in lines if line and not line.startswith("#version")]
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    types = [gguf.TokenType.CONTROL if t == "<|endoftext|>" else gguf.TokenType.NORMAL for t in tokens]
    path = tmp_path_factory.mktemp("gguf-tok") / "gpt2-vocab.gguf"
    w = gguf.GGUFWriter(str(path), "gpt2")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(50256)
    w.add_eos_token_id(50256)
    w.add_add_bos_token(False)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def gpt2_from_gguf(gpt2_gguf: Path) -> HFTokenizer:
    with kael.io.read_gguf(gpt2_gguf) as f:
        return tokenizer_from_gguf(f.metadata, str(gpt2_gguf))


@pytest.fixture(scope="module")
def gpt2_bpe() -> BpeTokenizer:
    return BpeTokenizer.from_directory(GPT2_DATA)


def test_gpt2_vocabulary_from_gguf_encodes_as_gpt2(gpt2_from_gguf: HFTokenizer, gpt2_bpe: BpeTokenizer) -> None:
    tok = gpt2_from_gguf
    assert tok.vocab_size == 50257
    assert tok.special_tokens == {"<|endoftext|>": 50256}
    assert (tok.bos_token_id, tok.eos_token_id, tok.eot_token) == (50256, 50256, 50256)
    for text in TEXTS:
        assert tok.encode(text) == gpt2_bpe.encode(text, allowed_special="all"), text
        assert tok.decode_text(tok.encode(text)) == text
        assert tok.decode(tok.encode(text)) == gpt2_bpe.decode(gpt2_bpe.encode(text, allowed_special="all"))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=60))
def test_gpt2_from_gguf_matches_the_tokenizers_library(
    gpt2_from_gguf: HFTokenizer, gpt2_json: HFTokenizer, text: str
) -> None:
    assert gpt2_from_gguf.encode(text) == gpt2_json.encode(text)


@pytest.fixture(scope="module")
def gpt2_json(tmp_path_factory: pytest.TempPathFactory) -> HFTokenizer:
    pytest.importorskip("transformers")
    return HFTokenizer.from_directory(write_gpt2(tmp_path_factory.mktemp("gpt2-json")))


def test_gpt2_bpe_round_trip_is_the_converters_layout(gpt2_gguf: Path, gpt2_bpe: BpeTokenizer) -> None:
    """kael's metadata for GPT-2's BPE is what the gguf package wrote for it (tokens, types, merges, ids)."""
    meta = tokenizer_to_gguf(gpt2_bpe)
    with kael.io.read_gguf(gpt2_gguf) as f:
        for key in ("model", "pre", "tokens", "token_type", "merges", "bos_token_id", "eos_token_id"):
            assert meta[f"tokenizer.ggml.{key}"] == f.metadata[f"tokenizer.ggml.{key}"], key


def _roundtrip(tok: HFTokenizer) -> HFTokenizer:
    return tokenizer_from_gguf(tokenizer_to_gguf(tok), "round trip")


@pytest.mark.parametrize("make", [write_byte_level, write_llama3], ids=["byte-level", "llama3"])
def test_hf_tokenizers_round_trip(tmp_path: Path, make: Any) -> None:
    original = HFTokenizer.from_directory(make(tmp_path / "tok"))
    meta = tokenizer_to_gguf(original)
    assert meta["tokenizer.ggml.pre"] == ("llama-bpe" if make is write_llama3 else "gpt-2")
    back = tokenizer_from_gguf(meta, "round trip")
    assert back.special_tokens == original.special_tokens
    assert (back.bos_token_id, back.eos_token_id) == (original.bos_token_id, original.eos_token_id)
    for text in [*TEXTS, "<|im_start|>user\nhi<|im_end|>", "<|begin_of_text|>x<|eot_id|>"]:
        for add in (True, False):
            assert back.encode(text, add_special_tokens=add) == original.encode(text, add_special_tokens=add), text


def test_qwen2_pre_tokenizer_round_trip(tmp_path: Path) -> None:
    from hf_fixtures import CORPUS
    from kael.tokenizer._gguf import PRE_TOKENIZERS
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tk = Tokenizer(models.BPE())
    tk.normalizer = normalizers.NFC()
    tk.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRE_TOKENIZERS["qwen2"]), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tk.train_from_iterator(CORPUS * 4, trainer)
    original = HFTokenizer.from_bytes(tk.to_str().encode(), json.dumps({"eos_token": "<|endoftext|>"}).encode())
    meta = tokenizer_to_gguf(original)
    assert meta["tokenizer.ggml.pre"] == "qwen2"
    back = tokenizer_from_gguf(meta)
    for text in [*TEXTS, "123456 numbers split one by one", "line\r\n\r\nbreaks  "]:
        assert back.encode(text) == tk.encode(text).ids, text


def test_chat_template_and_eos_travel(tmp_path: Path) -> None:
    original = HFTokenizer.from_directory(KAEL_TINY_CHAT)
    meta = tokenizer_to_gguf(original)
    assert meta["tokenizer.chat_template"] == original.chat_template.source
    back = tokenizer_from_gguf(meta)
    assert back.chat_template is not None and back.chat_template.source == original.chat_template.source
    messages = [{"role": "user", "content": "Write `f(x)`."}]
    rendered = back.chat_template.render(messages, add_generation_prompt=True)
    assert rendered == original.chat_template.render(messages, add_generation_prompt=True)
    assert back.encode(rendered) == original.encode(rendered)
    assert back.eos_token_id == original.eos_token_id == meta["tokenizer.ggml.eos_token_id"]


def _meta(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "gpt-2",
        "tokenizer.ggml.tokens": ["a", "b", "ab", "<|eot|>"],
        "tokenizer.ggml.token_type": [1, 1, 1, 3],
        "tokenizer.ggml.merges": ["a b"],
        "tokenizer.ggml.eos_token_id": 3,
    }
    base.update(overrides)
    return {k: v for k, v in base.items() if v is not None}


def test_a_tiny_vocabulary_reads() -> None:
    tok = tokenizer_from_gguf(_meta())
    assert tok.encode("abab<|eot|>") == [2, 2, 3]
    assert tok.eos_token_id == 3 and tok.special_tokens == {"<|eot|>": 3}
    bos = tokenizer_from_gguf(_meta(**{"tokenizer.ggml.bos_token_id": 3, "tokenizer.ggml.add_bos_token": True}))
    assert bos.encode("ab") == [3, 2] and bos.encode("ab", add_special_tokens=False) == [2]


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"tokenizer.ggml.model": None}, "no tokenizer in this file"),
        ({"tokenizer.ggml.model": "t5"}, r"'t5' vocabulary is not supported"),
        (
            {"tokenizer.ggml.model": "llama", "tokenizer.ggml.scores": [1.0]},
            "'tokenizer.ggml.scores' must be 4 numbers",
        ),
        ({"tokenizer.ggml.model": "bert"}, "'bert'"),
        ({"tokenizer.ggml.pre": "no-such-pre"}, r"tokenizer.ggml.pre 'no-such-pre' is not .* \(known: .*smollm"),
        ({"tokenizer.ggml.merges": ["a c"]}, r"merges\[0\] 'a c' names a token not in"),
        ({"tokenizer.ggml.merges": ["ab"]}, r"merges\[0\] is 'ab', expected 'left right'"),
        ({"tokenizer.ggml.tokens": ["a", "b", "ab", "a"]}, r"has 'a' twice \(ids 0 and 3\)"),
        ({"tokenizer.ggml.token_type": [1, 1]}, "must be 4 integers"),
        ({"tokenizer.ggml.eos_token_id": 9}, "'tokenizer.ggml.eos_token_id' is 9, outside the 4 tokens"),
        ({"tokenizer.ggml.eos_token_id": "3"}, "'tokenizer.ggml.eos_token_id' must be int"),
        ({"tokenizer.ggml.add_bos_token": True}, "add_bos_token is true but there is no bos_token_id"),
        ({"tokenizer.ggml.tokens": []}, "missing or empty"),
    ],
)
def test_malformed_metadata_is_a_format_error(overrides: dict[str, Any], match: str) -> None:
    with pytest.raises(kael.FormatError, match=match) as info:
        tokenizer_from_gguf(_meta(**overrides), "model.gguf")
    assert "model.gguf" in str(info.value)


def test_sentencepiece_style_tokenizers_are_not_written(tmp_path: Path) -> None:
    tok = HFTokenizer.from_directory(write_llama2(tmp_path / "llama2"))
    with pytest.raises(kael.FormatError, match="pre-tokenizer|byte-level BPE"):
        tokenizer_to_gguf(tok)
    with pytest.raises(kael.FormatError, match="expected a kael BpeTokenizer or HFTokenizer"):
        tokenizer_to_gguf("gpt2")  # type: ignore[arg-type]
