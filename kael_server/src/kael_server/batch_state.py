"""The batch scheduler's state: a job (Entry) and its choices (Seq), each choice one kael Request.

NOTE [kv memory]: rows bound the batch; memory is the KV cache's blocks, which kael's engine
manages (``kael.engine``: NOTE [one schedule] in scheduler.py). When a step cannot have its
blocks, the engine preempts the newest running request, which later resumes as an ordinary
prefill of its prompt and every token it produced, mostly served from the prefix cache; its
sampler and text output are untouched, so its answer is the unpreempted one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kael.engine import Request

from kael_server.jobs import Job
from kael_server.output import Choice

__all__ = ["Entry", "Seq"]


@dataclass(eq=False)
class Entry:
    """A job as the batch scheduler tracks it."""

    job: Job
    admitted: float
    """``time.perf_counter()`` at submit."""
    width: int
    """Rows it takes: one per choice."""
    ids: list[list[int]] | None = None
    """The checked prompts, once the encoder thread is done."""
    seqs: list[Seq] = field(default_factory=list)
    """Its choices, from the start on (by index)."""
    started: float = 0.0
    accepted: bool = False
    """Its prompts were accepted (counted): it is a generation, whatever happens next."""
    closed: bool = False
    """Its outcome was decided (on the worker)."""
    done: bool = False
    """Its final event was sent (under the lock, so it is sent once)."""


@dataclass(eq=False)
class Seq:
    """One choice of a job in the batch: the engine's Request that generates it."""

    entry: Entry
    choice: Choice
    request: Request | None = None
    """Its kael Request, once the job started (None for an echo-only job, ``max_tokens`` 0)."""
    text: str | None = None
    """Its whole text, once it ended."""
    counted: bool = False
    """Its prompt's cached tokens were added to the job's stats."""
