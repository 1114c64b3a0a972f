"""llama.cpp's byte-level BPE pre-tokenizers by name (kael/tokenizer/_gguf_pre.py) read from GGUF.

For each pre-tokenizer type a small byte-level BPE is trained with the ``tokenizers`` library
on a multilingual, code and digit-heavy corpus, with the split regexes of the model family's
own ``tokenizer.json`` where llama.cpp spells them differently (``(?i:...)`` contractions,
``\\p{Lu}``-style classes: an independent spelling of the same rule) and llama.cpp's otherwise;
it is written into a GGUF file with the ``gguf`` package as ``convert_hf_to_gguf.py`` writes
vocabularies, read back by kael under every name llama.cpp gives that type, and must encode
every text to the ids the ``tokenizers`` pipeline gives. When a ``llama-tokenize`` binary is
found (``KAEL_LLAMA_TOKENIZE``, or ``build/llama.cpp/bin``), its ids are compared too.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import kael
import llama_cpp_tools
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kael.tokenizer import tokenizer_from_gguf
from kael.tokenizer._gguf_pre import _NAMES_BY_TYPE, PRE_NAMES, PRE_TYPES, PreType
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

gguf = pytest.importorskip("gguf")

CORPUS = [
    "Hello world, this is a tiny corpus. It's 2024; they'll pay 1234567.89 EUR, we've 42 cats!",
    "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)\n\n\tx += 10_000\r\n",
    "Ünïcödé tëxt, emoji 🙂🚀, 中文字符 and русский текст, 日本語のテキスト, 한국어 문장, العربية.",
    "CamelCaseWords HTTPServer iPhone MAX_VALUE snake_case  spaces   and\ttabs\n\nnewlines",
    "3.14159265358979 + 2.71828 = 5.85987; 0xFF00FF, 1e-9, 100000000000, ١٢٣ ٤٥٦",
    "I'M SURE YOU'RE RIGHT; She'd say, \"don't\" — «quotes» (parens) [brackets] {braces} <tags>",
]
TEXTS = [
    *CORPUS,
    "  leading spaces, trailing spaces   ",
    "Numbers: 1, 12, 123, 1234, 12345, 123456 and 9876543210.",
    'fn main() { println!("{}", 1 << 20); } // Rust\nif (a && b || !c) { return -1; }',
    "",
]

# The model families' own tokenizer.json regexes where llama-vocab.cpp adapted them (quoted
# there as "original regex from tokenizer.json").
_ORIGINAL: dict[str, tuple[str, ...]] = {
    "llama3": (
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
        r"|\s+(?!\S)|\s+",
    ),
    "qwen2": (
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
        r"|\s+(?!\S)|\s+",
    ),
    "tekken": (
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?"
        r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*"
        r"|\s*[\r\n]+|\s+(?!\S)|\s+",
    ),
    "gpt4o": (
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
        r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
        r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    ),
    "seed-coder": (
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+"
        r"|\s+(?!\S)|\s+",
    ),
}
_ORIGINAL["dbrx"] = _ORIGINAL["chatglm4"] = _ORIGINAL["llama3"]
_ORIGINAL["qwen2-clean"] = _ORIGINAL["qwen2"]

BRIEF_NAMES = [
    "smollm", "llama3", "llama-bpe", "qwen2", "deepseek-llm", "deepseek-coder", "deepseek-v3", "falcon",
    "starcoder", "refact", "gpt-4o", "tekken", "olmo", "phi-2", "stablelm2", "command-r", "mpt", "gpt-2",
    "jais", "seed-coder", "exaone", "chatglm-bpe",
]  # fmt: skip


def _oracle(kind: str, spec: PreType) -> Tokenizer:
    """A byte-level BPE trained with ``tokenizers`` on CORPUS under the type's pre-tokenizer."""
    regexes = _ORIGINAL.get(kind, spec.regexes)
    tk = Tokenizer(models.BPE(ignore_merges=spec.ignore_merges))
    tk.pre_tokenizer = pre_tokenizers.Sequence(
        [
            *(pre_tokenizers.Split(Regex(r), behavior="isolated") for r in regexes),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=700,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tk.train_from_iterator(CORPUS * 3, trainer)
    return tk


def _write_gguf(tk: Tokenizer, pre: str, path: Path) -> None:
    """The vocabulary in a GGUF file, laid out as convert_hf_to_gguf.py writes a byte-level BPE."""
    import json

    model = json.loads(tk.to_str())["model"]
    tokens = [t for t, _ in sorted(model["vocab"].items(), key=lambda kv: kv[1])]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types([gguf.TokenType.CONTROL if t == "<|endoftext|>" else gguf.TokenType.NORMAL for t in tokens])
    w.add_token_merges(merges)
    w.add_bos_token_id(0)
    w.add_eos_token_id(0)
    w.add_add_bos_token(False)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()


def _read(path: Path) -> kael.tokenizer.HFTokenizer:
    reader = gguf.GGUFReader(str(path))
    meta = {}
    for name, field in reader.fields.items():
        if not name.startswith("tokenizer."):
            continue
        value = field.contents()
        meta[name] = value
    return tokenizer_from_gguf(meta, str(path))


@pytest.fixture(scope="module")
def oracles() -> dict[str, Tokenizer]:
    return {kind: _oracle(kind, spec) for kind, spec in PRE_TYPES.items()}


@pytest.fixture(scope="module")
def files(oracles: dict[str, Tokenizer], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = {}
    root = tmp_path_factory.mktemp("gguf-pre")
    for kind, names in _NAMES_BY_TYPE.items():
        for name in names:
            _write_gguf(oracles[kind], name, root / f"{name}.gguf")
            out[name] = root / f"{name}.gguf"
    return out


def test_the_brief_names_are_known() -> None:
    assert set(BRIEF_NAMES) <= set(PRE_NAMES)


@pytest.mark.parametrize(("kind", "name"), [(k, n) for k, names in _NAMES_BY_TYPE.items() for n in names])
def test_every_name_encodes_as_the_tokenizers_library(
    kind: str, name: str, oracles: dict[str, Tokenizer], files: dict[str, Path]
) -> None:
    tok = _read(files[name])
    oracle = oracles[kind]
    for text in TEXTS:
        assert tok.encode(text) == oracle.encode(text, add_special_tokens=False).ids, (name, text)
        assert tok.decode(tok.encode(text)) == text.encode("utf-8")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    kind=st.sampled_from(sorted(PRE_TYPES)),
    text=st.lists(
        st.sampled_from(list("aZé中한ع5٣ '\"\n\r\t.,;:!?_-+/\\()[]{}<>0123456789ßÆ🙂ᄀ") + ["'s", "'LL", "   "]),
        max_size=40,
    ).map("".join),
)
def test_hypothesis_texts_encode_as_the_tokenizers_library(
    kind: str, text: str, oracles: dict[str, Tokenizer], files: dict[str, Path]
) -> None:
    tok = _read(files[_NAMES_BY_TYPE[kind][0]])
    assert tok.encode(text) == oracles[kind].encode(text, add_special_tokens=False).ids


def test_llama3_family_adds_bos_by_default(oracles: dict[str, Tokenizer], tmp_path: Path) -> None:
    """llama.cpp adds BOS for llama3/tekken when the file says nothing; the metadata's flag wins."""
    meta = _meta_of(oracles["llama3"], "llama-bpe", tmp_path)
    del meta["tokenizer.ggml.add_bos_token"]
    assert tokenizer_from_gguf(meta, "m.gguf").encode("hi", add_special_tokens=True)[0] == 0
    meta["tokenizer.ggml.add_bos_token"] = False
    assert tokenizer_from_gguf(meta, "m.gguf").encode("hi", add_special_tokens=True)[:1] != [0]
    meta = _meta_of(oracles["gpt2"], "gpt-2", tmp_path)
    del meta["tokenizer.ggml.add_bos_token"]
    assert tokenizer_from_gguf(meta, "m.gguf").encode("hi", add_special_tokens=True)[:1] != [0]


def _meta_of(tk: Tokenizer, pre: str, tmp_path: Path) -> dict[str, object]:
    path = tmp_path / f"{pre}.gguf"
    _write_gguf(tk, pre, path)
    reader = gguf.GGUFReader(str(path))
    return {n: f.contents() for n, f in reader.fields.items() if n.startswith("tokenizer.")}


def test_unknown_name_is_refused_naming_the_known_ones(oracles: dict[str, Tokenizer], tmp_path: Path) -> None:
    meta = _meta_of(oracles["gpt2"], "gpt-2", tmp_path)
    meta["tokenizer.ggml.pre"] = "kimi-k2"
    with pytest.raises(kael.FormatError, match=r"m.gguf: tokenizer.ggml.pre 'kimi-k2' .*known: .*smollm.*tekken"):
        tokenizer_from_gguf(meta, "m.gguf")


def _llama_tokenize() -> str:
    return os.environ.get("KAEL_LLAMA_TOKENIZE") or llama_cpp_tools.require_tool("llama-tokenize")


@pytest.mark.parametrize("name", BRIEF_NAMES)
def test_ids_equal_llama_tokenize(name: str, files: dict[str, Path], tmp_path: Path) -> None:
    exe = _llama_tokenize()
    tok = _read(files[name])
    text = "\n".join(TEXTS)
    (tmp_path / "text.txt").write_text(text, encoding="utf-8")
    run = subprocess.run(
        [exe, "-m", str(files[name]), "-f", str(tmp_path / "text.txt"), "--ids", "--no-bos", "--log-disable"],
        capture_output=True,
        text=True,
        check=False,
    )
    if run.returncode != 0:
        pytest.skip(f"llama-tokenize cannot load a vocabulary-only file: {run.stderr[-300:]}")
    ids = [int(x) for x in run.stdout.strip().splitlines()[-1].strip("[]").split(",") if x.strip()]
    assert tok.encode(text) == ids


@pytest.mark.parametrize("kind", sorted(PRE_TYPES))
def test_a_read_vocabulary_writes_back_under_its_type(
    kind: str, oracles: dict[str, Tokenizer], files: dict[str, Path]
) -> None:
    """tokenizer_to_gguf names a type with the same splits and ignore_merges (types that differ only in
    clean_spaces look alike in a tokenizer.json) and the result reads back encoding alike."""
    from kael.tokenizer import tokenizer_to_gguf
    from kael.tokenizer._gguf_pre import PRE_WRITTEN_NAME

    tok = _read(files[_NAMES_BY_TYPE[kind][-1]])
    meta = tokenizer_to_gguf(tok)
    written = PRE_NAMES[meta["tokenizer.ggml.pre"]]
    assert (written.regexes, written.ignore_merges) == (PRE_TYPES[kind].regexes, PRE_TYPES[kind].ignore_merges)
    if kind in ("gpt2", "llama3", "qwen2", "starcoder-raw"):
        assert meta["tokenizer.ggml.pre"] == PRE_WRITTEN_NAME[kind]
    again = tokenizer_from_gguf(meta, "again.gguf")
    for text in TEXTS:
        assert again.encode(text) == oracles[kind].encode(text, add_special_tokens=False).ids
