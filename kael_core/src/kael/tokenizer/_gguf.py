"""Tokenizers in GGUF metadata: ``tokenizer_from_gguf`` (metadata -> ``HFTokenizer``) and
``tokenizer_to_gguf`` (a kael tokenizer -> the ``tokenizer.*`` metadata llama.cpp reads).

A GGUF file carries its tokenizer as metadata keys (llama.cpp's ``llama-vocab.cpp`` reads
them): ``tokenizer.ggml.model`` names the algorithm, ``tokenizer.ggml.tokens`` lists the
token strings by id, ``tokenizer.ggml.token_type`` their kinds (1 normal, 2 unknown,
3 control, 4 user-defined, 5 unused, 6 byte), ``tokenizer.ggml.merges`` the BPE merges
("left right", lowest rank first), ``tokenizer.ggml.pre`` the pre-tokenizer (a name
llama.cpp maps to its split regexes), the bos/eos/unknown/padding ids, whether a BOS
(EOS) is added, and ``tokenizer.chat_template``.

Byte-level BPE (``tokenizer.ggml.model == "gpt2"``) is supported for every pre-tokenizer
name in ``_gguf_pre.PRE_NAMES`` (llama.cpp's table): the metadata becomes a ``tokenizer.json``
(BPE model with the type's ``ignore_merges``, one ``Split`` per split regex of the type then
the byte-level mapping, control tokens as special added
tokens, user-defined ones as plain added tokens, a template post-processor when BOS/EOS
is added) run by the ``tokenizers`` library through ``HFTokenizer``, so it encodes as
llama.cpp and transformers do (BOS added by default where llama.cpp adds it, e.g. Llama 3; the metadata's
``add_bos_token`` decides when present). SentencePiece vocabularies (``"llama"``: scores, byte
fallback, ``add_space_prefix``, BOS added unless the metadata says otherwise) are built by
``_gguf_spm.spm_parts``; other models are a ``FormatError`` naming the model. Every malformed field is a ``FormatError`` naming
the source and the key.

NOTE [phi-3 rstrip]: a GGUF file stores no lstrip/rstrip for its added tokens; llama.cpp's vocabulary loader
sets them from ``general.name``: when the lowercased name contains ``phi-3`` or ``phi3`` (the converter names a
file after its checkpoint's folder; kael's ``save_gguf`` does not, NOTE [phi3 file name]), every special token
(control, user-defined, unknown) rstrips, then ``</s>`` does and ``<unk>``, ``<s>`` and ``<|endoftext|>`` do not
(Phi-3's tokenizer.json: ``<|end|>``, ``<|user|>``, ``<|assistant|>`` ... rstrip). It looks these four up with
``unordered_map::at``, so a vocabulary without any of them makes llama.cpp refuse the file ("error loading model
vocabulary: unordered_map::at"); kael reads it, flagging those present. An rstripping token swallows the
whitespace after it (``"<|end|>\\n<|assistant|>"`` is two ids); llama.cpp strips ASCII whitespace (C
``isspace``), the ``tokenizers`` library Unicode whitespace.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from kael._errors import FormatError
from kael.tokenizer._gguf_pre import PRE_TYPES, PRE_WRITTEN_NAME, PreType, pre_type
from kael.tokenizer._gguf_spm import spm_parts
from kael.tokenizer._hf import HFTokenizer
from kael.tokenizer._tokenizer import BpeTokenizer

__all__ = [
    "PRE_TOKENIZERS",
    "TOKEN_NORMAL",
    "TOKEN_UNKNOWN",
    "TOKEN_CONTROL",
    "TOKEN_USER_DEFINED",
    "TOKEN_UNUSED",
    "TOKEN_BYTE",
    "tokenizer_from_gguf",
    "tokenizer_to_gguf",
]

TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED, TOKEN_BYTE = 1, 2, 3, 4, 5, 6

_GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)

PRE_TOKENIZERS: dict[str, str] = {"gpt-2": _GPT2_SPLIT, "qwen2": _QWEN2_SPLIT, "llama-bpe": _LLAMA3_SPLIT}
"""The ``tokenizer.ggml.pre`` names ``tokenizer_to_gguf`` writes, with the split regex a
``tokenizer.json`` carries for them (GPT-2's is the one ``tokenizers``' ``ByteLevel(use_regex=True)``
applies itself). Reading knows every name of ``_gguf_pre.PRE_NAMES``."""

_KEY = "tokenizer.ggml."


def _byte_level(use_regex: bool) -> dict[str, Any]:
    return {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": use_regex}


def _pre_tokenizer(kind: PreType) -> dict[str, Any]:
    splits = [{"type": "Split", "pattern": {"Regex": r}, "behavior": "Isolated", "invert": False} for r in kind.regexes]
    return {"type": "Sequence", "pretokenizers": [*splits, _byte_level(False)]}


def _bpe_parts(
    kind: PreType, tokens: list[str], vocab: dict[str, int], merges: list[list[str]], unk: int | None
) -> dict[str, Any]:
    """The normalizer, pre-tokenizer, decoder and model of a byte-level BPE ``tokenizer.json``."""
    return {
        "normalizer": None,
        "pre_tokenizer": _pre_tokenizer(kind),
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": tokens[unk] if unk is not None else None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": kind.ignore_merges,
            "vocab": vocab,
            "merges": merges,
        },
    }


def _scores(metadata: Mapping[str, Any], n: int, source: str) -> list[float]:
    """``tokenizer.ggml.scores`` (one number per token; all 0 when absent, as llama.cpp)."""
    scores = _get(metadata, _KEY + "scores", list, source)
    if scores is None:
        return [0.0] * n
    if len(scores) != n or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in scores):
        raise FormatError(f"{source}: metadata 'tokenizer.ggml.scores' must be {n} numbers (one per token)")
    return [float(v) for v in scores]


def _phi3_rstrip(metadata: Mapping[str, Any], added: list[dict[str, Any]], vocab: dict[str, int], source: str) -> None:
    """Set ``rstrip`` on ``added`` as llama.cpp does for a file named Phi-3 (NOTE [phi-3 rstrip]; a listed token
    that is not special is not split out before the text is tokenized, so its flag changes nothing)."""
    name = _get(metadata, "general.name", str, source, "").lower()
    if "phi-3" not in name and "phi3" not in name:
        return
    by_id = {a["id"]: a for a in added}
    for a in added:
        a["rstrip"] = True
    for token, value in (("</s>", True), ("<unk>", False), ("<s>", False), ("<|endoftext|>", False)):
        if vocab.get(token) in by_id:
            by_id[vocab[token]]["rstrip"] = value


def _get(metadata: Mapping[str, Any], key: str, kind: type | tuple[type, ...], source: str, default: Any = None) -> Any:
    v = metadata.get(key, default)
    if v is default:
        return v
    if isinstance(v, bool) and kind is not bool:
        raise FormatError(f"{source}: metadata {key!r} must be {_kind_name(kind)}, got {v!r}")
    if not isinstance(v, kind):
        raise FormatError(f"{source}: metadata {key!r} must be {_kind_name(kind)}, got {type(v).__name__}")
    return v


def _kind_name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(k.__name__ for k in kinds)


def _token_id(metadata: Mapping[str, Any], name: str, n: int, source: str) -> int | None:
    key = f"{_KEY}{name}_token_id"
    v = _get(metadata, key, int, source)
    if v is None:
        return None
    if not 0 <= v < n:
        raise FormatError(f"{source}: metadata {key!r} is {v}, outside the {n} tokens of tokenizer.ggml.tokens")
    return int(v)


def tokenizer_from_gguf(metadata: Mapping[str, Any], source: str = "GGUF file") -> HFTokenizer:
    """The tokenizer a GGUF file's ``tokenizer.*`` metadata describes, as an ``HFTokenizer``.

    ``source`` names the file in errors. A vocabulary other than byte-level BPE (``gpt2``)
    or SentencePiece (``llama``), a pre-tokenizer kael does not know, or a malformed key is
    a ``FormatError``.
    """
    model = metadata.get(_KEY + "model")
    if model is None:
        raise FormatError(f"{source}: no tokenizer in this file (no metadata key 'tokenizer.ggml.model')")
    if model not in ("gpt2", "llama"):
        raise FormatError(
            f"{source}: tokenizer.ggml.model {model!r}: a {model!r} vocabulary is not supported "
            "(kael reads byte-level BPE, 'gpt2', and SentencePiece, 'llama')"
        )
    spm = model == "llama"
    # llama.cpp: a BPE file without a pre name runs its 'default' type; SentencePiece has none
    kind = None if spm else pre_type(_get(metadata, _KEY + "pre", str, source, "default"), source)
    tokens = _get(metadata, _KEY + "tokens", list, source)
    if tokens is None or not tokens:
        raise FormatError(f"{source}: metadata 'tokenizer.ggml.tokens' is missing or empty")
    if not all(isinstance(t, str) for t in tokens):
        raise FormatError(f"{source}: metadata 'tokenizer.ggml.tokens' must be a list of strings")
    n = len(tokens)
    types = _get(metadata, _KEY + "token_type", list, source)
    if types is None:
        types = [TOKEN_NORMAL] * n
    if len(types) != n or not all(isinstance(t, int) and not isinstance(t, bool) for t in types):
        raise FormatError(
            f"{source}: metadata 'tokenizer.ggml.token_type' must be {n} integers (one per token), got {len(types)}"
        )
    merges_raw = [] if spm else _get(metadata, _KEY + "merges", list, source, [])
    merges: list[list[str]] = []
    for rank, m in enumerate(merges_raw):
        parts = m.split(" ") if isinstance(m, str) else []
        if len(parts) != 2 or not all(parts):
            raise FormatError(f"{source}: tokenizer.ggml.merges[{rank}] is {m!r}, expected 'left right'")
        merges.append(parts)
    vocab: dict[str, int] = {}
    for i, t in enumerate(tokens):
        if t in vocab:
            raise FormatError(f"{source}: tokenizer.ggml.tokens has {t!r} twice (ids {vocab[t]} and {i})")
        vocab[t] = i
    for rank, (a, b) in enumerate(merges):
        if a not in vocab or b not in vocab or a + b not in vocab:
            raise FormatError(
                f"{source}: tokenizer.ggml.merges[{rank}] {a + ' ' + b!r} names a token not in tokenizer.ggml.tokens"
            )
    added = [
        {
            "id": i,
            "content": tokens[i],
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": t == TOKEN_USER_DEFINED,
            "special": t == TOKEN_CONTROL,
        }
        for i, t in enumerate(types)
        if t in (TOKEN_CONTROL, TOKEN_USER_DEFINED) or (spm and t == TOKEN_UNKNOWN)
    ]
    _phi3_rstrip(metadata, added, vocab, source)
    bos, eos, unk = (_token_id(metadata, k, n, source) for k in ("bos", "eos", "unknown"))
    if spm:  # llama.cpp's SentencePiece defaults: <unk> 0, <s> 1, </s> 2
        unk, bos, eos = (d if v is None and d < n else v for v, d in ((unk, 0), (bos, 1), (eos, 2)))
    pad = _token_id(metadata, "padding", n, source)
    add_bos = _get(metadata, _KEY + "add_bos_token", bool, source, True if kind is None else kind.add_bos)
    add_eos = _get(metadata, _KEY + "add_eos_token", bool, source, False)
    for flag, tid, name in ((add_bos, bos, "bos"), (add_eos, eos, "eos")):
        if flag and tid is None:
            raise FormatError(f"{source}: tokenizer.ggml.add_{name}_token is true but there is no {name}_token_id")
    processors: list[dict[str, Any]] = [] if spm else [_byte_level(True)]
    if add_bos or add_eos:
        specials: dict[str, Any] = {}
        for flag, tid in ((add_bos, bos), (add_eos, eos)):
            if flag:
                assert tid is not None
                specials[tokens[tid]] = {"id": tokens[tid], "ids": [tid], "tokens": [tokens[tid]]}
        front = [{"SpecialToken": {"id": tokens[bos], "type_id": 0}}] if add_bos and bos is not None else []
        back = [{"SpecialToken": {"id": tokens[eos], "type_id": 0}}] if add_eos and eos is not None else []
        single = [*front, {"Sequence": {"id": "A", "type_id": 0}}, *back]
        pair = [*single, *front, {"Sequence": {"id": "B", "type_id": 1}}, *back]
        processors.append({"type": "TemplateProcessing", "single": single, "pair": pair, "special_tokens": specials})
    spec: dict[str, Any] = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "post_processor": {"type": "Sequence", "processors": processors} if processors else None,
    }
    if kind is None:
        space = _get(metadata, _KEY + "add_space_prefix", bool, source, True)
        spec.update(spm_parts(tokens, _scores(metadata, n, source), vocab, unk, space))
    else:
        spec.update(_bpe_parts(kind, tokens, vocab, merges, unk))
    config: dict[str, Any] = {}
    for name, tid in (("bos_token", bos), ("eos_token", eos), ("unk_token", unk), ("pad_token", pad)):
        if tid is not None:
            config[name] = tokens[tid]
    template = _get(metadata, "tokenizer.chat_template", str, source)
    if template is not None:
        config["chat_template"] = template
    return HFTokenizer.from_bytes(
        json.dumps(spec).encode("utf-8"),
        json.dumps(config).encode("utf-8"),
        source=f"{source} (GGUF tokenizer)",
    )


def _pre_name(pre_tokenizer: Any, normalizer: Any, ignore_merges: bool = False) -> str | None:
    """The llama.cpp pre-tokenizer name of a ``tokenizer.json``'s normalizer and pre-tokenizer, or None."""
    if normalizer not in (None, {"type": "NFC"}):
        return None
    if isinstance(pre_tokenizer, dict) and pre_tokenizer.get("type") == "ByteLevel":
        if pre_tokenizer.get("use_regex", True) and not pre_tokenizer.get("add_prefix_space", False):
            return "gpt-2" if normalizer is None else None
        return None
    if not isinstance(pre_tokenizer, dict) or pre_tokenizer.get("type") != "Sequence":
        return None
    parts = pre_tokenizer.get("pretokenizers")
    if not isinstance(parts, list) or len(parts) < 2:
        return None
    *splits, level = parts
    if not (isinstance(level, dict) and level.get("type") == "ByteLevel" and not level.get("use_regex", True)):
        return None
    patterns: list[Any] = []
    for split in splits:
        if not (isinstance(split, dict) and split.get("type") == "Split" and split.get("behavior") == "Isolated"):
            return None
        patterns.append(split.get("pattern", {}).get("Regex") if isinstance(split.get("pattern"), dict) else None)
    if normalizer is None:  # the splits of a llama.cpp type, as tokenizer_from_gguf builds them
        for kind, spec in PRE_TYPES.items():
            if spec.regexes == tuple(patterns) and spec.ignore_merges == ignore_merges:
                return PRE_WRITTEN_NAME[kind]
    if len(patterns) != 1:
        return None
    pattern = patterns[0]
    known = {
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+": (
            "qwen2"
        ),
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+": (
            "llama-bpe"
        ),
    }
    return known.get(pattern) if isinstance(pattern, str) else None


def _bpe_tokenizer_parts(tok: BpeTokenizer) -> tuple[list[str], list[str], set[int]]:
    """(tokens by id, merges as "left right", special ids) of a GPT-2 BPE tokenizer."""
    inverse = {i: t for t, i in tok._encoder.items()}
    tokens = [inverse[i] for i in range(len(inverse))]
    pairs = sorted(tok._merges.ranks.items(), key=lambda kv: kv[1])
    merges = [f"{tokens[a]} {tokens[b]}" for (a, b), _ in pairs]
    return tokens, merges, set(tok.special_tokens.values())


def tokenizer_to_gguf(tokenizer: BpeTokenizer | HFTokenizer) -> dict[str, Any]:
    """The ``tokenizer.*`` metadata (plain Python values) of a byte-level BPE kael tokenizer.

    ``BpeTokenizer`` (GPT-2's) and ``HFTokenizer`` with a BPE model whose pre-tokenizer is
    one of ``PRE_TOKENIZERS`` (GPT-2's byte-level regex, Qwen2's, Llama 3's) are written;
    others are a ``FormatError`` naming what is not supported.
    """
    if isinstance(tokenizer, BpeTokenizer):
        bpe_tokens, bpe_merges, special = _bpe_tokenizer_parts(tokenizer)
        bpe_types = [TOKEN_CONTROL if i in special else TOKEN_NORMAL for i in range(len(bpe_tokens))]
        eot = tokenizer.eot_token if special else None
        out: dict[str, Any] = {
            _KEY + "model": "gpt2",
            _KEY + "pre": "gpt-2",
            _KEY + "tokens": bpe_tokens,
            _KEY + "token_type": bpe_types,
            _KEY + "merges": bpe_merges,
            _KEY + "add_bos_token": False,
        }
        if eot is not None:
            out[_KEY + "bos_token_id"] = eot
            out[_KEY + "eos_token_id"] = eot
        if tokenizer.chat_template is not None:
            out["tokenizer.chat_template"] = tokenizer.chat_template.source
        return out
    if not isinstance(tokenizer, HFTokenizer):
        raise FormatError(
            f"tokenizer_to_gguf: expected a kael BpeTokenizer or HFTokenizer, got {type(tokenizer).__name__}"
        )
    spec = json.loads(tokenizer._tk.to_str())
    model = spec.get("model", {})
    if model.get("type") != "BPE" or model.get("byte_fallback") or model.get("continuing_subword_prefix"):
        raise FormatError(
            f"tokenizer_to_gguf: {tokenizer._source}: only byte-level BPE tokenizers can be written to GGUF, "
            f"this one has a {model.get('type')!r} model"
        )
    pre = _pre_name(spec.get("pre_tokenizer"), spec.get("normalizer"), bool(model.get("ignore_merges")))
    if pre is None:
        raise FormatError(
            f"tokenizer_to_gguf: {tokenizer._source}: its normalizer {json.dumps(spec.get('normalizer'))[:80]} and "
            f"pre-tokenizer {json.dumps(spec.get('pre_tokenizer'))[:120]} match none of llama.cpp's "
            f"byte-level pre-tokenizers kael writes ({sorted(PRE_TOKENIZERS)})"
        )
    n = tokenizer.vocab_size
    tokens_by_id: dict[int, str] = {i: t for t, i in model["vocab"].items()}
    types_by_id: dict[int, int] = {}
    for a in spec.get("added_tokens", []):
        tokens_by_id[a["id"]] = a["content"]
        types_by_id[a["id"]] = TOKEN_CONTROL if a.get("special") else TOKEN_USER_DEFINED
    tokens: list[str] = []
    types: list[int] = []
    for i in range(n):
        t = tokens_by_id.get(i)
        if t is None:  # a gap in the ids: llama.cpp's converter fills it with an unused token
            tokens.append(f"[PAD{i}]")
            types.append(TOKEN_UNUSED)
        else:
            tokens.append(t)
            types.append(types_by_id.get(i, TOKEN_NORMAL))
    merges = [m if isinstance(m, str) else f"{m[0]} {m[1]}" for m in model.get("merges", [])]
    bos_id = tokenizer.bos_token_id
    probe = tokenizer.encode("a", add_special_tokens=True)
    out = {
        _KEY + "model": "gpt2",
        _KEY + "pre": pre,
        _KEY + "tokens": tokens,
        _KEY + "token_type": types,
        _KEY + "merges": merges,
        _KEY + "add_bos_token": bool(bos_id is not None and probe[:1] == [bos_id]),
    }
    eos_id = tokenizer.eos_token_id
    if bos_id is not None:
        out[_KEY + "bos_token_id"] = bos_id
    if eos_id is not None:
        out[_KEY + "eos_token_id"] = eos_id
        if eos_id is not None and probe[-1:] == [eos_id] and probe[:1] != [eos_id]:
            out[_KEY + "add_eos_token"] = True
    if tokenizer.chat_template is not None:
        out["tokenizer.chat_template"] = tokenizer.chat_template.source
    return out
