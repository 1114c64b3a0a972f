"""Fuzz target: Hugging Face tokenizer files (`tokenizer.json`, `tokenizer_config.json`) and chat templates.

An input is `tokenizer.json NUL tokenizer_config.json NUL text` (missing parts are empty;
an empty config means none). Each input:

* builds an `HFTokenizer` from the two files (`HFTokenizer.from_bytes`): success or
  `kael.FormatError` only (a malformed config's chat template included);
* for a tokenizer that loads: `encode(text)` gives ints in 0..vocab_size-1, with and
  without special tokens (or the FormatError kael raises when the `tokenizers` library
  fails on this text: a Rust panic or an id that stands for no token); `decode` and `decode_text` of them succeed; streaming the ids
  through the incremental decoder gives `decode(ids)` as text; every special token's bytes
  are its text or the library's decoding of it;
* renders the config's chat template, if any, over a fixed conversation and one whose
  contents are the text: a string, or `kael.ChatTemplateError` (never another exception);
  `end_of_turn_tokens` gives ids of special tokens.

The text is the fuzzed bytes decoded with "surrogateescape", so invalid UTF-8 arrives as
lone surrogates, which `encode` spells as U+FFFD.
"""

from __future__ import annotations

import _harness

with _harness.instrumented(__name__ == "__main__", ["kael"]):
    from kael import ChatTemplateError, FormatError
    from kael.tokenizer import HFTokenizer


def _check_tokenizer(tok: HFTokenizer, text: str) -> None:
    n = tok.vocab_size
    ids: list[int] = []
    for add in (True, False):
        ids = tok.encode(text, add_special_tokens=add)
        bad = [i for i in ids if not (type(i) is int and 0 <= i < n)]
        if bad:
            raise AssertionError(f"encode gave ids outside 0..{n - 1}: {bad[:5]}")
        data = tok.decode(ids)
        if not isinstance(data, bytes):
            raise AssertionError(f"decode gave {type(data).__name__}, not bytes")
        if not isinstance(tok.decode_text(ids, skip_special_tokens=True), str):
            raise AssertionError("decode_text gave no str")
    stream = tok.incremental_decoder()
    streamed = "".join(stream.add(i) for i in ids) + stream.flush()
    expected = tok.decode(ids).decode("utf-8", "replace")
    if streamed != expected:
        raise AssertionError(f"incremental decoder gave {streamed!r}, decode {expected!r}")
    for name, token_id in list(tok.special_tokens.items())[:8]:
        # its text, or what the library's decoder makes of it (a Replace step turns a
        # special token's U+2581 into a space, as the library itself decodes it)
        spelled = {name.encode("utf-8"), tok.decode_text([token_id]).encode("utf-8")}
        if tok.token_bytes(token_id) not in spelled:
            raise AssertionError(f"special token {name!r} decodes to {tok.token_bytes(token_id)!r}, not {spelled}")


def _check_template(tok: HFTokenizer, text: str) -> None:
    template = tok.chat_template
    if template is None:
        return
    conversations = [
        [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"}],
        [{"role": "user", "content": text}, {"role": "assistant", "content": text}],
    ]
    for messages in conversations:
        for add in (True, False):
            try:
                rendered = template.render(messages, add_generation_prompt=add)
            except ChatTemplateError:
                continue
            if not isinstance(rendered, str):
                raise AssertionError(f"render gave {type(rendered).__name__}, not str")
    enders = template.end_of_turn_tokens(tok)
    if not set(enders) <= set(tok.special_tokens.values()):
        raise AssertionError(f"end_of_turn_tokens gave ids that are not special tokens: {enders}")


def TestOneInput(data: bytes) -> None:
    tokenizer_json, _, rest = data.partition(b"\0")
    config, _, raw_text = rest.partition(b"\0")
    text = raw_text.decode("utf-8", "surrogateescape")
    try:
        tok = HFTokenizer.from_bytes(tokenizer_json, config or None)
    except FormatError:
        return
    try:
        _check_tokenizer(tok, text)
    except FormatError as e:
        # The tokenizers library checks little at load; kael's probe at load catches most
        # files it cannot run, and a failure on some other text must be this FormatError.
        if "the tokenizers library cannot run this file" not in str(e) and "stands for no token" not in str(e):
            raise
    _check_template(tok, text)


if __name__ == "__main__":
    _harness.fuzz(TestOneInput)
