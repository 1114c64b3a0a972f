"""Admission control: which generation jobs run, where, and how many at once.

The server talks to a Scheduler only through ``submit`` (admit now or raise Busy, never
wait), ``running`` and ``wait_idle``, so a batching scheduler (several sequences sharing
each decode step, a bounded wait queue) can replace SlotPool without touching the routes.
"""

from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable

from kael_server.errors import Busy
from kael_server.jobs import Failed, Job, Outcome

__all__ = ["Scheduler", "SlotPool"]


class Scheduler(ABC):
    """What the routes ask of an admission policy: ``submit`` a job (admitted at once or refused with Busy,
    never a wait in the request), the jobs ``running`` now, and ``wait_idle`` for a drain.

    ``capacity`` is how many sequences it generates at once (``SlotPool``: one per slot;
    ``kael_server.batching.BatchScheduler``: the rows of one batched decode step).
    """

    capacity: int

    @abstractmethod
    def submit(self, job: Job) -> None:
        """Admits ``job`` (starts it, or queues it if the scheduler has a queue) or raises Busy at
        once. Once it returns, the scheduler owns the job and finishes it (``job.emit`` of
        Finished or Failed) after releasing its slot."""

    @abstractmethod
    def running(self) -> list[Job]:
        """The jobs holding a slot now."""

    @abstractmethod
    def wait_idle(self, timeout: float) -> bool:
        """Blocks until no job holds a slot, or ``timeout`` seconds; True if idle."""


class SlotPool(Scheduler):
    """``capacity`` slots, each job on a worker thread of its own that owns its slot.

    The worker releases the slot in ``finally`` *before* emitting the final event, so a
    client that has its answer can start the next request at once, and nothing the client
    does (never reading its stream, leaving) can keep the slot.
    """

    def __init__(self, run: Callable[[Job], Outcome], capacity: int = 1) -> None:
        if capacity < 1:
            raise ValueError(f"SlotPool capacity must be at least 1, got {capacity!r}")
        self.capacity = capacity
        self._run = run
        self._jobs: set[Job] = set()
        self._changed = threading.Condition()

    def submit(self, job: Job) -> None:
        with self._changed:
            if len(self._jobs) >= self.capacity:
                raise Busy
            self._jobs.add(job)
        worker = threading.Thread(target=self._work, args=(job,), name="kael-generate", daemon=True)
        try:
            worker.start()
        except BaseException:
            self._release(job)
            raise

    def running(self) -> list[Job]:
        with self._changed:
            return list(self._jobs)

    def wait_idle(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self._changed:
            while self._jobs:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._changed.wait(left)
            return True

    def _work(self, job: Job) -> None:
        outcome: Outcome
        try:
            outcome = self._run(job)
        except BaseException as exc:  # the job must finish whatever happens in the worker
            outcome = Failed(exc)
        finally:
            self._release(job)
        job.emit(outcome)

    def _release(self, job: Job) -> None:
        with self._changed:
            self._jobs.discard(job)
            self._changed.notify_all()
