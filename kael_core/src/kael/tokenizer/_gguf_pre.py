r"""llama.cpp's byte-level BPE pre-tokenizers by ``tokenizer.ggml.pre`` name: ``PRE_TYPES``.

One row per pre-tokenizer type of llama.cpp's ``src/llama-vocab.cpp`` that the
``tokenizers`` library can express: its split regexes (the ``regex_exprs`` of the
``llm_tokenizer_bpe`` constructor, applied one after the other, each splitting every piece
the previous ones left, matches and the text between them kept, i.e. a ``Split`` with
``Isolated`` behaviour per regex, then the GPT-2 byte mapping) and the flags that
``llama_vocab::impl::load`` sets for it: ``ignore_merges`` (a piece that is a whole token is
that token), ``clean_spaces`` (``clean_up_tokenization_spaces`` on decode) and the default of
``add_bos`` (the metadata key ``tokenizer.ggml.add_bos_token`` overrides it). ``PRE_NAMES``
maps every name llama.cpp accepts for such a type to its row.

The regexes are facts read from llama-vocab.cpp (where llama.cpp spells a ``(?i:...)`` or a
look-ahead class out, its spelling is kept: Oniguruma, which ``tokenizers`` runs, reads both).
Types llama.cpp tokenizes with custom C++ (``kimi-k2``, ``afmoe``, ``superbpe``), without
the byte mapping (``gemma4``, ``sarvam-moe``, ``whitespace``) or that are not byte-level BPE
are not listed: such a name is a ``FormatError`` naming it and the known ones.
"""

# ruff: noqa: RUF001  (the regexes name look-alike code points on purpose: they are facts copied from llama.cpp)

from __future__ import annotations

from dataclasses import dataclass

from kael._errors import FormatError

__all__ = ["PreType", "PRE_TYPES", "PRE_NAMES", "PRE_WRITTEN_NAME", "pre_type"]


@dataclass(frozen=True)
class PreType:
    """One llama.cpp pre-tokenizer type: split regexes (in order) and the vocabulary flags it sets."""

    regexes: tuple[str, ...]
    ignore_merges: bool = False
    clean_spaces: bool = True
    add_bos: bool = False


_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3 = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_QWEN2 = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
# Greek and letterlike code points that NFC would fold (U+1F7D, U+1FBE, U+1FD3, U+1FDB, U+2126,
# U+212A) are escaped so that the ranges stay exactly as llama-vocab.cpp writes them.
_DEEPSEEK_LLM_LETTERS = "\\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-\u1f7dᾀ-ᾴᾶ-ᾼ\u1fbeῂ-ῄῆ-ῌῐ-\u1fd3ῖ-\u1fdbῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤ\u2126ℨ\u212a-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+"
_DEEPSEEK3_MAIN = (
    r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
    r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_UPPER = r"((?=[\p{L}])([^a-z]))"
_LOWER = r"((?=[\p{L}])([^A-Z]))"
_TEKKEN = (
    rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_GPT4O = (
    rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+{_CONTRACTIONS}?|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*{_CONTRACTIONS}?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_CASED = r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]"
_LOWERED = r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]"
_TINY_AYA = (
    rf"[^\r\n\p{{L}}\p{{N}}]?{_CASED}*{_LOWERED}+{_CONTRACTIONS}?|[^\r\n\p{{L}}\p{{N}}]?{_CASED}+{_LOWERED}*"
    rf"{_CONTRACTIONS}?|\p{{N}}{{1,3}}| ?[^\s\p{{L}}\p{{N}}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

_T_LLAMA3 = PreType((_LLAMA3,), ignore_merges=True, add_bos=True)
_T_DBRX = PreType((_LLAMA3,))
_T_DEEPSEEK_LLM = PreType(
    (
        r"[\r\n]",
        _DEEPSEEK_LLM_LETTERS,
        r"\s?[!-/:-~！-／：-～‘-‟　-。]+",
        r"\s+$",
        r"[一-龥ࠀ-一가-퟿]+",
        r"\p{N}+",
    ),
    clean_spaces=False,
)
_T_DEEPSEEK3 = PreType((r"\p{N}{1,3}", r"[一-龥぀-ゟ゠-ヿ]+", _DEEPSEEK3_MAIN), clean_spaces=False)
_T_DEEPSEEK_CODER = PreType((r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", r"[一-龥ࠀ-一가-퟿]+", r"\p{N}"), clean_spaces=False)
_T_FALCON = PreType((r"[\p{P}\$\+<=>\^~\|`]+", _GPT2, r"[0-9][0-9][0-9]"))
_STARCODER = (r"\p{N}", _GPT2)
_T_STARCODER = PreType(_STARCODER)
_T_STARCODER_RAW = PreType(_STARCODER, clean_spaces=False)
_T_GPT2 = PreType((_GPT2,))
_T_GPT2_RAW = PreType((_GPT2,), clean_spaces=False)
_T_QWEN2 = PreType((_QWEN2,), clean_spaces=False)
_T_QWEN2_CLEAN = PreType((_QWEN2,))
_T_QWEN35 = PreType(
    (
        _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+"
        r"|\s+(?!\S)|\s+",
    ),
    clean_spaces=False,
)
_BLOOM = (r" ?[^(\s|.,!?…。，、।۔،)]+",)
_T_PORO = PreType(_BLOOM, clean_spaces=False)
_T_BLOOM = PreType(_BLOOM)
_T_CHATGLM4 = PreType((_LLAMA3,))
_T_TEKKEN = PreType((_TEKKEN,), ignore_merges=True, clean_spaces=False, add_bos=True)
_T_GPT4O = PreType((_GPT4O,), clean_spaces=False)
_T_TINY_AYA = PreType((r"\d{1,3}(?=(?:\d{3})*\b)", _TINY_AYA), clean_spaces=False)
_T_SEED_CODER = PreType(
    (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+",),
    clean_spaces=False,
)
_T_BAILINGMOE = PreType(
    (
        r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
        r"|\s*[\r\n]|\s+(?!\S)|\s+",
    ),
    clean_spaces=False,
)
_T_UFAKZEKA = PreType(
    (r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",), clean_spaces=False
)
_T_MINICPM5 = PreType(
    (
        r"\p{N}{1,3}",
        _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    ),
    ignore_merges=True,
)
_T_JAIS2 = PreType(
    (
        _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
        r"|\s{512}(?!\S)|\s{256}(?!\S)|\s{128}(?!\S)|\s{64}(?!\S)|\s{32}(?!\S)|\s{16}(?!\S)|\s{8}(?!\S)"
        r"|\s{4}(?!\S)|\s{1,2}(?!\S)|\s{1}",
    )
)

PRE_TYPES: dict[str, PreType] = {
    "default": PreType((r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", r"[0-9][0-9][0-9]")),
    "llama3": _T_LLAMA3,
    "dbrx": _T_DBRX,
    "deepseek-llm": _T_DEEPSEEK_LLM,
    "deepseek3-llm": _T_DEEPSEEK3,
    "deepseek-coder": _T_DEEPSEEK_CODER,
    "falcon": _T_FALCON,
    "starcoder-raw": _T_STARCODER_RAW,  # before starcoder: a SmolLM vocabulary writes back as "smollm"
    "starcoder": _T_STARCODER,
    "gpt2": _T_GPT2,
    "gpt2-raw": _T_GPT2_RAW,
    "qwen2": _T_QWEN2,
    "qwen2-clean": _T_QWEN2_CLEAN,
    "qwen35": _T_QWEN35,
    "poro": _T_PORO,
    "bloom": _T_BLOOM,
    "chatglm4": _T_CHATGLM4,
    "tekken": _T_TEKKEN,
    "gpt4o": _T_GPT4O,
    "tiny-aya": _T_TINY_AYA,
    "seed-coder": _T_SEED_CODER,
    "bailingmoe": _T_BAILINGMOE,
    "ufakzeka": _T_UFAKZEKA,
    "minicpm5": _T_MINICPM5,
    "jais2": _T_JAIS2,
}
"""The pre-tokenizer types (named after llama.cpp's ``LLAMA_VOCAB_PRE_TYPE_*``; a ``-raw``/``-clean``
suffix where names of one type differ only in ``clean_spaces``)."""

_NAMES_BY_TYPE: dict[str, tuple[str, ...]] = {
    "default": ("default",),
    "llama3": ("llama-bpe", "llama3", "llama-v3", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2"),
    "dbrx": ("dbrx", "smaug-bpe"),
    "deepseek-llm": ("deepseek-llm",),
    "deepseek3-llm": ("deepseek-v3", "hunyuan-dense", "joyai-llm", "hy_v4"),
    "deepseek-coder": ("deepseek-coder",),
    "falcon": ("falcon",),
    "starcoder": ("starcoder", "refact", "codeshell", "exaone", "minerva-7b", "mellum2"),
    "starcoder-raw": ("smollm", "command-r"),
    "gpt2": (
        "gpt-2",
        "phi-2",
        "jina-es",
        "jina-de",
        "gigachat",
        "jina-v2-es",
        "jina-v2-de",
        "a.x-4.0",
        "mellum",
        "modern-bert",
        "mpt",
        "olmo",
        "jais",
        "exaone4",
    ),
    "gpt2-raw": ("trillion", "granite-docling"),
    "qwen2": ("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "hunyuan", "solar-open", "grok-2"),
    "qwen2-clean": ("stablelm2", "megrez"),
    "qwen35": ("qwen35",),
    "poro": ("poro-chat",),
    "bloom": ("bloom", "gpt3-finnish"),
    "chatglm4": ("chatglm-bpe", "glm4"),
    "tekken": ("tekken",),
    "gpt4o": ("gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"),
    "tiny-aya": ("tiny_aya", "cohere2moe"),
    "seed-coder": ("seed-coder",),
    "bailingmoe": ("bailingmoe", "bailingmoe2", "llada-moe"),
    "ufakzeka": ("ufakzeka",),
    "minicpm5": ("minicpm5",),
    "jais2": ("jais-2",),
}

PRE_NAMES: dict[str, PreType] = {name: PRE_TYPES[t] for t, names in _NAMES_BY_TYPE.items() for name in names}
"""Every ``tokenizer.ggml.pre`` name kael reads, to its pre-tokenizer type."""

PRE_WRITTEN_NAME: dict[str, str] = {kind: names[0] for kind, names in _NAMES_BY_TYPE.items()}
"""The name ``tokenizer_to_gguf`` writes for a type (``convert_hf_to_gguf.py``'s, e.g. ``llama-bpe``)."""


def pre_type(name: str, source: str) -> PreType:
    """The pre-tokenizer type of the ``tokenizer.ggml.pre`` value ``name`` (``source`` names the file).

    An unknown name is a ``FormatError`` naming it and listing the names kael knows.
    """
    found = PRE_NAMES.get(name)
    if found is None:
        raise FormatError(
            f"{source}: tokenizer.ggml.pre {name!r} is not a byte-level BPE pre-tokenizer kael knows "
            f"(known: {', '.join(sorted(PRE_NAMES))})"
        )
    return found
