"""``DraftModelProposer``: speculative decoding's drafts from a smaller model.

A draft model (any kael ``CausalLM`` with the target's vocabulary: a small model of the same
family, quantized or not) keeps its own paged KV cache, one ``BatchDecoder`` row per request it
drafts for. Each ``propose`` first brings the row in line with the request's ids: the positions
both share stay, the rest of the row goes (``truncate`` within the last block, else the row is
started again from the ids, whose full blocks the draft's prefix cache still holds), and the
ids it lacks are fed: up to ``REFILL_AFTER`` one decode step each, more (after speculation was
paused, NOTE [speculation pays or pauses]) by starting the row again from the ids, one prefill
pass over what its prefix cache lacks with the LM head on the last position only (32 ids fed
one by one took about 20 ms on a 2-layer GPT-2 drafter with GPT-2's vocabulary, two steps of its
GPT-2-small target); then it decodes greedily ``k`` tokens, feeding all but the last. Drafts
only decide how fast verification goes, never what the target outputs (speculative.py).

A request's row goes back when it finishes (``release``, from the ``Speculator``; rows of
requests that finished unseen go at the next ``propose``); a request that finds no free row,
or no room in the draft's cache, gets no drafts that step.
"""

from __future__ import annotations

from typing import Any

from .._errors import KaelError
from ..ops import argmax, view
from .proposers import count_arg
from .request import Request

__all__ = ["REFILL_AFTER", "DraftModelProposer"]

REFILL_AFTER = 4
"""Ids a draft row lacks beyond which it is started again by one prefill instead of a decode step each."""


class DraftModelProposer:
    """Greedy drafts of ``draft`` (module docstring): at most ``k`` tokens per step, for up to
    ``rows`` requests at once. ``target``, when given, is checked to share the draft's
    vocabulary size and device (a KaelError naming both otherwise)."""

    def __init__(self, draft: Any, *, k: int = 4, rows: int = 8, target: Any = None) -> None:
        from ..models import BatchDecoder  # kael.models imports the engine: imported when built

        self.k = count_arg("DraftModelProposer", "k", k, 1)
        count_arg("DraftModelProposer", "rows", rows, 1)
        if target is not None:
            if int(target.vocab_size) != int(draft.vocab_size):
                raise KaelError(
                    f"DraftModelProposer: the draft model's vocabulary ({draft.vocab_size} tokens) differs from "
                    f"the target's ({target.vocab_size}); a draft must share the target's tokenizer"
                )
            if str(target.device) != str(draft.device):
                raise KaelError(
                    f"DraftModelProposer: the draft model is on {draft.device}, the target on {target.device}; "
                    "put both on one device"
                )
        self.decoder = BatchDecoder(draft, rows=rows)
        self._rows: dict[Request, tuple[int, list[int]]] = {}
        """Each request's draft row and the ids whose keys and values it holds."""
        self._free = list(range(rows - 1, -1, -1))

    def propose(self, request: Request, k: int) -> list[int]:
        """Up to ``min(k, self.k)`` greedy draft ids to follow ``request.all_ids``."""
        from ..models import KVCacheFull

        self._sweep()
        ids = request.all_ids
        k = min(k, self.k, self.decoder.max_positions - len(ids))
        if k <= 0:
            return []
        try:
            synced = self._sync(request, ids)
            if synced is None:
                return []
            row, logits = synced
            fed = self._rows[request][1]
            out: list[int] = []
            for i in range(k):
                token = int(argmax(view(logits, self.decoder.vocab_size)).item())
                out.append(token)
                if i + 1 < k:
                    logits = self.decoder.decode([row], [token])
                    fed.append(token)
            return out
        except KVCacheFull:
            self._drop(request)
            return []

    def _sync(self, request: Request, ids: list[int]) -> tuple[int, Any] | None:
        """The request's row holding ``ids``' keys and values, and the draft's logits after them."""
        entry = self._rows.get(request)
        if entry is None:
            if not self._free:
                return None
            row = self._free.pop()
            self._rows[request] = (row, list(ids))
            return row, self.decoder.prefill(row, ids)
        row, fed = entry
        same = 0
        for a, b in zip(fed, ids):
            if a != b:
                break
            same += 1
        keep = min(same, len(ids) - 1)  # the last id is fed again: its logits are the ones wanted
        if len(ids) - keep > REFILL_AFTER:
            return row, self._refill(row, fed, ids)
        try:
            if keep < len(fed):
                self.decoder.cache.truncate(row, keep)
                del fed[keep:]
        except KaelError:  # it would cut into a full block: start the row again from the ids
            return row, self._refill(row, fed, ids)
        logits = None
        for token in ids[keep:]:
            logits = self.decoder.decode([row], [token])
            fed.append(token)
        return row, logits

    def _refill(self, row: int, fed: list[int], ids: list[int]) -> Any:
        """``row`` started again from ``ids`` (one prefill; its prefix cache keeps the full blocks it had);
        the draft's logits after them."""
        self.decoder.release(row)
        fed[:] = list(ids)
        return self.decoder.prefill(row, ids)

    def release(self, request: Request) -> None:
        """``request`` finished: its draft row goes back to the free list."""
        self._drop(request)

    def _sweep(self) -> None:
        """Rows of finished requests go back to the free list."""
        for request in [r for r in self._rows if r.status.finished]:
            self._drop(request)

    def _drop(self, request: Request) -> None:
        entry = self._rows.pop(request, None)
        if entry is not None:
            self.decoder.release(entry[0])
            self._free.append(entry[0])

    def __repr__(self) -> str:
        return f"DraftModelProposer(k={self.k}, rows={self.decoder.rows})"
