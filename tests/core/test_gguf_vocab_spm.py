"""SentencePiece vocabularies in GGUF (``tokenizer.ggml.model = "llama"``; kael/tokenizer/_gguf_spm.py).

A Llama-2-style byte-fallback BPE trained with the ``tokenizers`` library (tests/core/hf_fixtures.py
``write_llama2``: ``<unk> <s> </s>``, the 256 ``<0xXX>`` tokens, then the learnt pieces) is written
into a GGUF file with the ``gguf`` package as ``convert_hf_to_gguf.py`` writes a SentencePiece
vocabulary (tokens, scores, token types, bos/eos/unk ids, add_bos/add_eos), scores being minus the
rank of the merge that made each piece. Oracles: llama.cpp's ``llm_tokenizer_spm`` algorithm written
out here plainly (merge the adjacent pair whose concatenation is the highest-scoring token, leftmost
on ties; a piece that is no token becomes its byte tokens) and transformers' ``LlamaTokenizerFast``
on the same vocabulary, for ids and decoded text.
"""

from __future__ import annotations

import json
from pathlib import Path

import kael
import pytest
from hf_fixtures import write_llama2
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kael.tokenizer import HFTokenizer, tokenizer_from_gguf

gguf = pytest.importorskip("gguf")
transformers = pytest.importorskip("transformers")

TEXTS = [
    "Hello world, this is a tiny corpus for a tiny tokenizer.",
    "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)\n",
    "Ünïcödé tëxt, emoji 🙂🚀, 中文字符 and русский текст. 12345 67890 3.14159",
    "  spaces   and\ttabs\n\nnewlines\r\n",
    "I'm sure you're right; they'll see we've done it, she'd say.",
    "<s>special</s> in the middle <unk> x",
]


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_llama2(tmp_path_factory.mktemp("llama2-tok"))


def _vocab(hf_dir: Path) -> tuple[list[str], list[float], list[int]]:
    spec = json.loads((hf_dir / "tokenizer.json").read_text(encoding="utf-8"))
    vocab = spec["model"]["vocab"]
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    made = {}
    for rank, m in enumerate(spec["model"]["merges"]):
        a, b = m.split(" ") if isinstance(m, str) else m
        made.setdefault(a + b, rank)
    scores = [-float(made.get(t, 0)) for t in tokens]
    types = [
        gguf.TokenType.UNKNOWN
        if t == "<unk>"
        else gguf.TokenType.CONTROL
        if t in ("<s>", "</s>")
        else gguf.TokenType.BYTE
        if t.startswith("<0x")
        else gguf.TokenType.NORMAL
        for t in tokens
    ]
    return tokens, scores, types


def _metadata(
    hf_dir: Path, tmp_path: Path, name: str | None = None, controls: tuple[str, ...] = (), **flags: bool
) -> dict[str, object]:
    """The tokenizer metadata (and ``general.name``, given a ``name``) of the file ``spm.gguf`` written in
    ``tmp_path``: the fixture's vocabulary, then ``controls`` as control tokens."""
    tokens, scores, types = _vocab(hf_dir)
    tokens, scores = [*tokens, *controls], [*scores, *([0.0] * len(controls))]
    types = [*types, *([gguf.TokenType.CONTROL] * len(controls))]
    path = tmp_path / "spm.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    if name is not None:
        w.add_name(name)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(flags.get("add_bos", True))
    w.add_add_eos_token(flags.get("add_eos", False))
    if "add_space_prefix" in flags:
        w.add_add_space_prefix(flags["add_space_prefix"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()
    reader = gguf.GGUFReader(str(path))
    return {n: f.contents() for n, f in reader.fields.items() if n.startswith(("tokenizer.", "general.name"))}


def _llama_cpp_spm(text: str, tokens: list[str], scores: list[float], add_space_prefix: bool = True) -> list[int]:
    """llama.cpp's SentencePiece tokenization of raw text (no special tokens), written out plainly."""
    ids = {t: i for i, t in enumerate(tokens)}
    if not text:
        return []
    text = ((" " if add_space_prefix else "") + text).replace(" ", "\u2581")
    syms = list(text)
    while True:
        best, best_score = -1, 0.0
        for i in range(len(syms) - 1):
            j = ids.get(syms[i] + syms[i + 1])
            if j is not None and (best < 0 or scores[j] > best_score):
                best, best_score = i, scores[j]
        if best < 0:
            break
        syms[best : best + 2] = [syms[best] + syms[best + 1]]
    out: list[int] = []
    for s in syms:
        if s in ids:
            out.append(ids[s])
        else:
            out.extend(ids[f"<0x{b:02X}>"] for b in s.encode("utf-8"))
    return out


@pytest.fixture(scope="module")
def spm(hf_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> HFTokenizer:
    return tokenizer_from_gguf(_metadata(hf_dir, tmp_path_factory.mktemp("spm")), "spm.gguf")


@pytest.fixture(scope="module")
def hf(hf_dir: Path) -> object:
    return transformers.LlamaTokenizerFast(tokenizer_file=str(hf_dir / "tokenizer.json"), legacy=False)


def test_ids_equal_llama_cpps_algorithm(spm: HFTokenizer, hf_dir: Path) -> None:
    tokens, scores, _ = _vocab(hf_dir)
    for text in TEXTS[:-1]:
        assert spm.encode(text, add_special_tokens=False) == _llama_cpp_spm(text, tokens, scores), text
        assert spm.encode(text, add_special_tokens=True) == [1, *_llama_cpp_spm(text, tokens, scores)]
    # special tokens split the text; llama.cpp prefixes a space to the raw text after each one
    parts = [*_llama_cpp_spm("special", tokens, scores), 2, *_llama_cpp_spm(" in the middle ", tokens, scores)]
    assert spm.encode(TEXTS[-1]) == [1, 1, *parts, 0, *_llama_cpp_spm(" x", tokens, scores)]


def _hf_comparable(text: str) -> bool:
    """The fixture's Metaspace(prepend_scheme="first") adds no ``▁`` to a text that starts with a space;
    llama.cpp (and the legacy converter's Prepend normalizer) always add it: compare the others.
    Nor does it after a special token, where llama.cpp adds it again."""
    return not text.startswith(" ") and "<s>" not in text


def test_ids_and_text_equal_llama_tokenizer_fast(spm: HFTokenizer, hf: object) -> None:
    for text in filter(_hf_comparable, TEXTS):
        ids = hf.encode(text)  # type: ignore[attr-defined]
        assert spm.encode(text, add_special_tokens=True) == ids, text
        assert spm.decode_text(ids, skip_special_tokens=True) == hf.decode(ids, skip_special_tokens=True)  # type: ignore[attr-defined]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    text=st.lists(st.sampled_from(list("abcdefghijklmnoprstuvwxyz ,.'\n\t0123456789éü中🙂") + ["the ", "  "])).map(
        "".join
    )
)
def test_hypothesis_texts(text: str, spm: HFTokenizer, hf: object, hf_dir: Path) -> None:
    tokens, scores, _ = _vocab(hf_dir)
    assert spm.encode(text, add_special_tokens=False) == _llama_cpp_spm(text, tokens, scores)
    if not _hf_comparable(text):
        return
    ids = hf.encode(text)  # type: ignore[attr-defined]
    assert spm.encode(text, add_special_tokens=True) == ids
    assert spm.decode_text(ids, skip_special_tokens=True) == hf.decode(ids, skip_special_tokens=True)  # type: ignore[attr-defined]


def test_metadata_flags(hf_dir: Path, tmp_path: Path) -> None:
    tokens, scores, _ = _vocab(hf_dir)
    tok = tokenizer_from_gguf(_metadata(hf_dir, tmp_path, add_bos=False, add_eos=True), "m.gguf")
    assert tok.encode("hello world", add_special_tokens=True) == [*_llama_cpp_spm("hello world", tokens, scores), 2]
    tok = tokenizer_from_gguf(_metadata(hf_dir, tmp_path, add_space_prefix=False), "m.gguf")
    assert tok.encode("hello world", add_special_tokens=False) == _llama_cpp_spm(
        "hello world", tokens, scores, add_space_prefix=False
    )
    assert tok.decode_text(tok.encode("hello world", add_special_tokens=False)) == "hello world"


def test_bad_scores_are_a_format_error(hf_dir: Path, tmp_path: Path) -> None:
    meta = _metadata(hf_dir, tmp_path)
    meta["tokenizer.ggml.scores"] = [0.0, 1.0]
    with pytest.raises(kael.FormatError, match=r"m.gguf: metadata 'tokenizer.ggml.scores' must be \d+ numbers"):
        tokenizer_from_gguf(meta, "m.gguf")


def test_ids_equal_llama_tokenize(hf_dir: Path, tmp_path: Path) -> None:
    """llama.cpp's own tokenizer on the same file (its ``llama-tokenize`` binary, vocabulary only)."""
    import os
    import subprocess

    import llama_cpp_tools

    exe = os.environ.get("KAEL_LLAMA_TOKENIZE") or llama_cpp_tools.require_tool("llama-tokenize")
    meta_dir = tmp_path / "m"
    meta_dir.mkdir()
    spm = tokenizer_from_gguf(_metadata(hf_dir, meta_dir), "spm.gguf")
    for i, text in enumerate(TEXTS):
        (tmp_path / f"t{i}.txt").write_text(text, encoding="utf-8")
        run = subprocess.run(
            [exe, "-m", str(meta_dir / "spm.gguf"), "-f", str(tmp_path / f"t{i}.txt"), "--ids", "--log-disable"],
            capture_output=True,
            text=True,
            check=False,
        )
        assert run.returncode == 0, run.stderr[-500:]
        ids = [int(x) for x in run.stdout.strip().splitlines()[-1].strip("[]").split(",") if x.strip()]
        assert spm.encode(text, add_special_tokens=True) == ids, text


PHI3_TEXT = "a</s> \n b<s>  c<unk>\t d<|endoftext|> e</s>"
PHI3_NAMES = ["Phi3 Mini 4k Instruct", "Phi-3.5-mini", "Phi 3 Medium", "Llama 2"]
EOT = "<|endoftext|>"


def _phi3_named(name: str) -> bool:
    return "phi3" in name.lower() or "phi-3" in name.lower()


@pytest.mark.parametrize("name", PHI3_NAMES)
def test_a_file_named_phi_3_rstrips_its_special_tokens(hf_dir: Path, tmp_path: Path, name: str) -> None:
    """llama.cpp's rule (NOTE [phi-3 rstrip] in kael/tokenizer/_gguf.py): in a file whose name contains ``phi3``
    or ``phi-3``, ``</s>`` swallows the whitespace after it and ``<s>``, ``<unk>`` and ``<|endoftext|>`` do not;
    other names, none does. The oracle is the rule and llama.cpp's SentencePiece algorithm, written out here."""
    tokens, scores, _ = _vocab(hf_dir)
    tok = tokenizer_from_gguf(_metadata(hf_dir, tmp_path, name, (EOT,)), "m.gguf")
    cut = (lambda s: s.lstrip(" \n\t")) if _phi3_named(name) else (lambda s: s)
    eot = len(tokens)
    want = [1, *_llama_cpp_spm("a", tokens, scores), 2, *_llama_cpp_spm(cut(" \n b"), tokens, scores), 1]
    want += [*_llama_cpp_spm("  c", tokens, scores), 0, *_llama_cpp_spm("\t d", tokens, scores), eot]
    want += [*_llama_cpp_spm(" e", tokens, scores), 2]
    assert tok.encode(PHI3_TEXT) == want


def test_a_file_named_phi_3_tokenizes_as_llama_tokenize(hf_dir: Path, tmp_path: Path) -> None:
    """The same files through llama.cpp's ``llama-tokenize`` (vocabulary only); a file named Phi-3 whose
    vocabulary lacks ``<|endoftext|>`` llama.cpp refuses (it looks the token up to clear its flag), kael reads."""
    import os
    import subprocess

    import llama_cpp_tools

    exe = os.environ.get("KAEL_LLAMA_TOKENIZE") or llama_cpp_tools.require_tool("llama-tokenize")
    (tmp_path / "t.txt").write_text(PHI3_TEXT, encoding="utf-8")

    def llama_tokenize(d: Path) -> subprocess.CompletedProcess[str]:
        cmd = [exe, "-m", str(d / "spm.gguf"), "-f", str(tmp_path / "t.txt"), "--ids", "--log-disable"]
        return subprocess.run(cmd, capture_output=True, text=True, check=False)

    for i, name in enumerate(PHI3_NAMES):
        d = tmp_path / str(i)
        d.mkdir()
        tok = tokenizer_from_gguf(_metadata(hf_dir, d, name, (EOT,)), "m.gguf")
        run = llama_tokenize(d)
        assert run.returncode == 0, run.stderr[-500:]
        ids = [int(x) for x in run.stdout.strip().splitlines()[-1].strip("[]").split(",") if x.strip()]
        assert tok.encode(PHI3_TEXT) == ids, name
    d = tmp_path / "no-eot"
    d.mkdir()
    tok = tokenizer_from_gguf(_metadata(hf_dir, d, PHI3_NAMES[0]), "m.gguf")
    assert llama_tokenize(d).returncode != 0
    tokens, scores, _ = _vocab(hf_dir)
    assert tok.encode("a</s> b") == [1, *_llama_cpp_spm("a", tokens, scores), 2, *_llama_cpp_spm("b", tokens, scores)]
