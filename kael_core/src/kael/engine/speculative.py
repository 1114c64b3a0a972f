"""Speculative decoding: drafts per request with an adaptive k, and their verification counters.

NOTE [speculation identical to plain decoding]: a running request past its prefill, with a
``Speculator`` on the engine, gets a plan row of ``1 + k`` tokens: its last sampled token and
``k`` drafts from the ``Proposer`` (``ScheduledRow.drafts``), computed in the same pass as the
plain decode rows, with every position's logits. ``EngineCore`` then samples those positions in
order exactly as plain decoding samples one step after another (greedy: the argmax; seeded:
the request's sampler or generator, so its random stream is consumed one draw per token as
without speculation), appending each token (the one stop function runs on each: an end
token, a stop string or ``max_tokens`` ends the request where plain decoding would). It goes
on to the next position only while the sampled token equals the draft there, so every draw
belongs to a token that plain decoding draws too, and nothing has to be rewound in the
sampler or its logits processors. The keys and values of the rejected drafts are dropped
(``KVManager.truncate``): drafts only ever go where they leave the last KV block not full
(``KVManager.draft_room``), so no block holding an unverified token is ever registered in the
prefix cache (NOTE [draft tail] in kael.models._block_truncate).

The one thing that could differ is the logits themselves: the verifying pass computes a row's
``1 + k`` positions together, where plain decoding computes one per step (NOTE [batched =
alone]: kael's attention and few-row linears give the same bits for up to 16 query rows).

NOTE [adaptive k]: each request starts at the proposer's ``k`` (at most ``k_max``). A
verification that accepts every draft doubles it (at most ``k_max``: a run of accepted drafts is
a copy under way, and copies end, so k gets there in a few steps rather than one more a step); a
rejection sets it to the accepted count plus one, except a probe's (NOTE [speculation pays or
pauses]: its one draft says nothing of how far the request's drafts run). After ``off_after``
verifications in a row with no accepted draft the request stops speculating for ``cooldown``
decode steps (doubling up to ``max_cooldown`` while it keeps failing, back to ``cooldown`` after
a success), then tries again. A step without drafts costs only the proposer's lookup.

NOTE [speculation pays or pauses]: acceptance alone does not say whether speculation pays: a
small model's step is compute-bound, so verifying 1 + k positions costs nearly 1 + k steps,
and a draft model costs its own steps. ``EngineCore`` reports each all-decode step's wall time,
tokens and rows (``observe_step``). The speculator keeps a moving average of the seconds per
token of plain steps for each number of rows (a step of 3 rows costs more per token than one of
8: the step's fixed cost is shared by fewer), and sets each step with drafts against plain steps
of as many rows, or of the nearest number seen: the ratio of their costs per token.

Speculation starts after ``warmup`` plain steps (the baseline). Each try (the first all-decode
step with drafts after the warm-up, and after each pause) is a probe: one draft per request,
judged on its own. A probe that pays ends the probing, and NOTE [adaptive k]'s k applies from the
next step. After that, whenever the median of the last three ratios is above ``1 + slack`` (the
median, so that one slow step, a collection or another thread's burst, is not taken for a loss),
every request stops drafting for ``probe_after`` steps (doubling, up to ``max_probe_after``,
while it keeps losing; back to the first value once it pays), and a probe tries again; a probe
whose drafts were accepted but cost more pauses the same way.

A losing probe in which no draft was accepted says that the drafts are wrong for now (a copy that
has not started yet: a pause of 32 steps was most of a short answer), not that verifying costs
too much. It pauses for ``idle_pause`` steps instead (doubling likewise, so drafts that stay
wrong, a random task's, are tried ever more seldom), or for (r - 1) / slack steps where the probe
cost r times a plain step's tokens (a draft model's probe costs more than a prompt lookup's). A
losing probe costs about r - 1 steps, so its loss is at most ``slack`` of the steps until the
next try, from the start.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from .._errors import KaelError
from .proposers import Proposer, count_arg
from .request import Request

__all__ = ["MAX_DRAFT_TOKENS", "SpecState", "Speculator", "speculator_for"]

MAX_DRAFT_TOKENS = 15
"""Drafts per verification at most: 1 + 15 query rows, the most whose kernels match one at a time."""


@dataclass
class SpecState:
    """One request's speculation state (NOTE [adaptive k])."""

    k: int
    zero_streak: int = 0
    pause: int = 0
    """Decode steps left without speculation."""
    cooldown: int = 0


class Speculator:
    """Drafts from ``proposer`` for each decoding request, sized by NOTE [adaptive k], and the
    counters of what verification made of them (``proposed``, ``accepted``, ``rejected``,
    ``verifications``; ``acceptance_rate``).

    ``k_max``: the most drafts per step (default: the proposer's ``k``, else 4; at most 15, so a
    verifying row stays within the 16 query rows whose kernels match one at a time).
    """

    def __init__(
        self,
        proposer: Proposer,
        *,
        k_max: int | None = None,
        off_after: int = 3,
        cooldown: int = 8,
        max_cooldown: int = 64,
        warmup: int = 2,
        probe_after: int = 32,
        max_probe_after: int = 256,
        idle_pause: int = 8,
        slack: float = 0.03,
    ) -> None:
        if not isinstance(proposer, Proposer):
            raise KaelError(f"Speculator: proposer must have propose(request, k), got {type(proposer).__name__}")
        self.proposer = proposer
        default = getattr(proposer, "k", 4)
        self.k_max = count_arg("Speculator", "k_max", default if k_max is None else k_max, 1)
        if self.k_max > MAX_DRAFT_TOKENS:
            raise KaelError(
                f"Speculator: k_max must be at most {MAX_DRAFT_TOKENS} (16 query rows per verification), got {k_max!r}"
            )
        self.off_after = count_arg("Speculator", "off_after", off_after, 1)
        self.cooldown = count_arg("Speculator", "cooldown", cooldown, 1)
        self.max_cooldown = count_arg("Speculator", "max_cooldown", max_cooldown, self.cooldown)
        self.probe_after = count_arg("Speculator", "probe_after", probe_after, 1)
        self.max_probe_after = count_arg("Speculator", "max_probe_after", max_probe_after, self.probe_after)
        self.idle_pause = count_arg("Speculator", "idle_pause", idle_pause, 1)
        if not isinstance(slack, (int, float)) or isinstance(slack, bool) or not 0 <= slack < 1:
            raise KaelError(f"Speculator: slack must be a number in [0, 1), got {slack!r}")
        self.slack = float(slack)
        self._state: dict[Request, SpecState] = {}
        self._plain: dict[int, float] = {}
        """Moving average of seconds per token of plain all-decode steps, by their number of rows."""
        self._ratios: list[float] = []
        """The cost ratios to the plain baseline of the last (up to three) steps with drafts."""
        self.paused_steps = count_arg("Speculator", "warmup", warmup, 0)
        """Steps left in which no request drafts (NOTE [speculation pays or pauses])."""
        self._probe_after = self.probe_after
        self._idle_pause = self.idle_pause
        self._step_accepted = 0
        """Drafts accepted in the step being run (``record``), for ``observe_step``."""
        self.probing = True
        """Steps with drafts are probes, one draft per request, until one pays (NOTE [speculation pays or
        pauses])."""
        self.pauses = 0
        self.proposed = 0
        self.accepted = 0
        self.verifications = 0

    @property
    def rejected(self) -> int:
        """Draft tokens the target did not confirm."""
        return self.proposed - self.accepted

    @property
    def acceptance_rate(self) -> float:
        """Accepted drafts over proposed ones (0 before any)."""
        return self.accepted / self.proposed if self.proposed else 0.0

    def state(self, request: Request) -> SpecState:
        """``request``'s speculation state (created at its first draft)."""
        st = self._state.get(request)
        if st is None:
            st = self._state[request] = SpecState(self.k_max, cooldown=self.cooldown)
        return st

    def drafts(self, request: Request, room: int) -> list[int]:
        """Up to ``room`` draft ids for ``request``'s next decode step (NOTE [adaptive k]); empty
        while its speculation is paused or nothing is proposed."""
        if self.paused_steps:
            return []
        st = self.state(request)
        if st.pause:
            st.pause -= 1
            return []
        k = min(1 if self.probing else st.k, room)
        if k <= 0:
            return []
        out = [int(t) for t in self.proposer.propose(request, k)][:k]
        return out

    def record(self, request: Request, proposed: int, accepted: int) -> None:
        """What verifying ``proposed`` drafts of ``request`` gave: ``accepted`` of them confirmed."""
        if proposed <= 0:
            return
        self.proposed += proposed
        self.accepted += accepted
        self._step_accepted += accepted
        self.verifications += 1
        st = self.state(request)
        if accepted == proposed:
            st.k = min(self.k_max, 2 * max(st.k, proposed))
        elif not self.probing:
            st.k = max(1, accepted + 1)
        if accepted:
            st.zero_streak, st.cooldown = 0, self.cooldown
            return
        st.zero_streak += 1
        if st.zero_streak >= self.off_after:
            st.pause, st.zero_streak = st.cooldown, 0
            st.cooldown = min(self.max_cooldown, 2 * st.cooldown)
            st.k = self.k_max

    def observe_step(self, seconds: float, tokens: int, speculated: bool, rows: int = 0) -> None:
        """What one all-decode step of ``rows`` requests cost: ``seconds`` for ``tokens`` new tokens,
        with drafts verified in it or not (NOTE [speculation pays or pauses])."""
        accepted, self._step_accepted = self._step_accepted, 0
        if tokens <= 0 or not seconds >= 0:
            return
        per = seconds / tokens
        if not speculated:
            old = self._plain.get(rows)
            self._plain[rows] = per if old is None else old + 0.3 * (per - old)
            self.paused_steps = max(0, self.paused_steps - 1)
            return
        if not self._plain:
            return
        base = self._plain[min(self._plain, key=lambda n: (abs(n - rows), -n))]
        self._ratios = [*self._ratios[-2:], per / base if base > 0 else 1.0]
        judged = self._ratios[-1] if self.probing else sorted(self._ratios)[(len(self._ratios) - 1) // 2]
        if judged > 1 + self.slack and (self.probing or len(self._ratios) > 1):
            self.pauses += 1
            if self.probing and not accepted:  # the drafts were wrong, not the verification dear
                # long enough that the probe's extra cost is at most `slack` of the steps it spans
                spans = math.ceil((judged - 1) / max(self.slack, 0.01) - 1e-9)
                self.paused_steps = min(max(self._idle_pause, spans), self.max_probe_after)
                self._idle_pause = min(2 * self._idle_pause, self.max_probe_after)
            else:
                self.paused_steps, self._probe_after = (
                    self._probe_after,
                    min(2 * self._probe_after, self.max_probe_after),
                )
            self._ratios = []  # the next probe measures afresh
            self.probing = True
        else:
            if self.probing:
                self._ratios = []  # the probe's one draft a row says little of the cost of k drafts
            self._probe_after, self._idle_pause = self.probe_after, self.idle_pause
            self.probing = False

    def forget(self, request: Request) -> None:
        """Drops a finished request's state (and the proposer's, ``Proposer.release``)."""
        self._state.pop(request, None)
        self.proposer.release(request)

    def stats(self) -> dict[str, float]:
        """The counters, for metrics."""
        return {
            "spec_proposed_tokens": self.proposed,
            "spec_accepted_tokens": self.accepted,
            "spec_rejected_tokens": self.rejected,
            "spec_verifications": self.verifications,
            "spec_acceptance_rate": self.acceptance_rate,
            "spec_pauses": self.pauses,
        }


def speculator_for(kind: str, k: int, draft: Any = None, *, rows: int = 1, target: Any = None) -> Speculator:
    """The ``Speculator`` of ``--speculative KIND --spec-tokens K``: ``"ngram"`` (``NgramProposer``) or
    ``"draft"`` (a ``DraftModelProposer`` over the loaded model ``draft``, ``rows`` rows, checked against
    ``target``); both the CLI and kael-server build theirs here. KaelError for anything else."""
    from .draft_proposer import DraftModelProposer
    from .proposers import NgramProposer

    if kind == "ngram":
        return Speculator(NgramProposer(k=k), k_max=k)
    if kind == "draft" and draft is not None:
        return Speculator(DraftModelProposer(draft, k=k, rows=rows, target=target), k_max=k)
    raise KaelError(f"speculator_for: expected 'ngram', or 'draft' with a draft model, got {kind!r}")
