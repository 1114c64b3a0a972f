"""Admission control: which generation jobs run, where, and how many at once.

The server talks to a Scheduler only through ``submit`` (admit now or raise Busy, never
wait), ``running`` and ``wait_idle``, so a batching scheduler (several sequences sharing
each decode step, a bounded wait queue: kael_server.batching.BatchScheduler, the one there is)
serves them without touching the routes.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from kael_server.jobs import Job

__all__ = ["Scheduler"]


class Scheduler(ABC):
    """What the routes ask of an admission policy: ``submit`` a job (admitted at once or refused with Busy,
    never a wait in the request), the jobs ``running`` now, and ``wait_idle`` for a drain.

    ``capacity`` is how many sequences it generates at once (``kael_server.batching.BatchScheduler``:
    the slots, the rows of one batched decode step).
    """

    capacity: int

    @abstractmethod
    def submit(self, job: Job) -> None:
        """Admits ``job`` (starts it, or queues it if the scheduler has a queue) or raises Busy at
        once. Once it returns, the scheduler owns the job and finishes it (``job.emit`` of
        Finished or Failed) after releasing its slot."""

    def full(self) -> bool:
        """Whether ``submit`` would raise Busy now (a hint: a request that is costly to prepare
        is refused before the work; ``submit`` still decides)."""
        return False

    @abstractmethod
    def running(self) -> list[Job]:
        """The jobs holding a slot now."""

    @abstractmethod
    def wait_idle(self, timeout: float) -> bool:
        """Blocks until no job holds a slot, or ``timeout`` seconds; True if idle."""
