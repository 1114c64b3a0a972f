"""``--speculative`` and ``--draft-model``: checked before the server listens, then the engine's
``kael.engine.Speculator`` built when the model loads.

- ``ngram``: prompt lookup (``kael.engine.NgramProposer``);
- ``draft``: a smaller model's greedy drafts (``kael.engine.DraftModelProposer``) from
  ``--draft-model`` (a checkpoint directory, a bundled model's name or a GGUF file), which must
  share the served model's vocabulary; its vocabulary size is read from its config.json or GGUF
  header and compared with the served model's before anything is loaded or listened on.

Either way the outputs are the tokens the model gives without speculation.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kael_server.config import ServerConfig
from kael_server.errors import ServerConfigError

__all__ = ["build_speculator", "check_speculation", "vocab_size_of"]


def vocab_size_of(path: Path, flag: str) -> int:
    """The vocabulary size a checkpoint directory's config.json or a GGUF file's tokenizer states
    (ServerConfigError naming ``flag`` for a file that cannot be read or is malformed)."""
    import kael

    try:
        if path.is_file():
            f = kael.io.read_gguf(path)
            try:
                tokens = f.metadata.get("tokenizer.ggml.tokens")
            finally:
                f.close()
            if tokens is None:  # kael serves a GGUF file only with its tokenizer
                raise ServerConfigError(f"{flag} {str(path)!r}: the GGUF file holds no tokenizer")
            return len(tokens)
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, kael.KaelError) as exc:
        raise ServerConfigError(f"{flag} {str(path)!r}: cannot read its vocabulary size ({exc})") from None
    size = config.get("vocab_size") if isinstance(config, dict) else None
    if isinstance(size, bool) or not isinstance(size, int):
        raise ServerConfigError(f"{flag} {str(path)!r}: config.json has no integer vocab_size")
    return size


def check_speculation(config: ServerConfig, target: Path) -> Path | None:
    """The draft model's path, checked (ServerConfigError naming the flag): ``--speculative draft``
    needs ``--draft-model``, which needs ``--speculative draft``, and the draft's vocabulary must
    be the served model's. None without a draft model."""
    from kael_server.loading import checkpoint_dir

    if config.speculative == "draft" and config.draft_model is None:
        raise ServerConfigError("--speculative draft needs --draft-model DIR (the model that drafts)")
    if config.draft_model is None:
        return None
    if config.speculative != "draft":
        raise ServerConfigError("--draft-model needs --speculative draft")
    try:
        draft = checkpoint_dir(config.draft_model)
    except ServerConfigError as exc:
        raise ServerConfigError(str(exc).replace("--data", "--draft-model", 1)) from None
    ours, theirs = vocab_size_of(target, "--data"), vocab_size_of(draft, "--draft-model")
    if ours != theirs:
        raise ServerConfigError(
            f"--draft-model {config.draft_model!r}: its vocabulary has {theirs} tokens, the served model's {ours}; "
            "a draft model must share the served model's tokenizer"
        )
    return draft


def build_speculator(config: ServerConfig, model: Any, draft: Path | None, rows: int) -> Any:
    """The ``kael.engine.Speculator`` of ``config`` (None without ``--speculative``); a draft model
    loads here, on the served model's device."""
    if config.speculative is None:
        return None
    import kael
    from kael.engine import speculator_for

    k = config.spec_tokens
    if config.speculative == "ngram":
        return speculator_for("ngram", k)
    assert draft is not None  # check_speculation saw to it
    if draft.is_file():
        drafter, _ = kael.models.load_gguf(draft, device=config.device)
    else:
        drafter = kael.models.from_pretrained(draft, device=config.device)
    try:
        return speculator_for("draft", k, drafter, rows=rows, target=model)
    except kael.KaelError as exc:
        raise ServerConfigError(f"--draft-model {config.draft_model!r}: {exc}") from None
