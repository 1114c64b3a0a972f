"""The chained prefix keys of a paged KV cache's full blocks, and the pool's argument checks.

NOTE [prefix keys]: a full block is identified by its chained key ``digest(namespace,
parent's key, its token ids)`` (the first block's parent key is empty), so a key stands
for the whole prefix up to the block's end in one model (``namespace``). A digest
collision must never make two different contents share a block, so the index is only a
fast path: each full block also carries a *content id* (cid) and the registered block
stores ``(parent cid, token ids)``; a lookup that finds a key reuses the block only when
both equal exactly what it is looking for. By induction on the depth, equal cids mean
equal token prefixes (a block takes an existing cid only after that exact check, and
cids are never reused), whatever the digest does.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence

from .._errors import ShapeError

__all__ = ["Digest", "block_keys", "count_arg", "default_digest", "encode_block", "token_ids"]

Digest = Callable[[bytes], bytes]


def default_digest(data: bytes) -> bytes:
    """The pool's key digest: 32-byte BLAKE2b."""
    return hashlib.blake2b(data, digest_size=32).digest()


def _field(data: bytes) -> bytes:
    return str(len(data)).encode() + b":" + data


def encode_block(namespace: str, parent: bytes, tokens: Sequence[int]) -> bytes:
    """The bytes a block's chained key digests: its namespace, parent key and token ids."""
    # Length-prefixed fields and comma-separated decimal ids: no two inputs encode alike.
    body = b",".join(str(t).encode() for t in tokens)
    return b"kael-kv-block\0" + _field(namespace.encode()) + _field(parent) + _field(body)


def count_arg(method: str, name: str, value: object, minimum: int) -> int:
    """``value`` if it is an int >= ``minimum``, else ShapeError naming ``BlockPool<method>``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ShapeError(f"BlockPool{method}: {name} must be an int >= {minimum}, got {value!r}")
    return value


def token_ids(where: str, tokens: object) -> list[int]:
    """``tokens`` as a non-empty list of non-negative int ids, else ShapeError naming ``where``."""
    if isinstance(tokens, (str, bytes)) or not isinstance(tokens, Sequence):
        raise ShapeError(f"{where}: tokens must be a sequence of token ids, got {type(tokens).__name__}")
    out = list(tokens)
    if not out:
        raise ShapeError(f"{where}: tokens must hold at least one token id, got an empty sequence")
    for i, t in enumerate(out):
        if isinstance(t, bool) or not isinstance(t, int) or t < 0:
            raise ShapeError(f"{where}: token {i} must be a non-negative int, got {t!r}")
    return out


def block_keys(
    tokens: Sequence[int], block_size: int = 16, namespace: str = "", digest: Digest = default_digest
) -> list[bytes]:
    """The chained keys of the full blocks of ``tokens`` (NOTE [prefix keys]), first block first."""
    count_arg(".block_keys", "block_size", block_size, 1)
    ids = token_ids("block_keys", tokens)
    keys: list[bytes] = []
    parent = b""
    for i in range(len(ids) // block_size):
        parent = digest(encode_block(namespace, parent, ids[i * block_size : (i + 1) * block_size]))
        keys.append(parent)
    return keys
