"""Generator: the model, its tokenizer and everything needed to run one generation safely."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

from kael_server.errors import Cancelled, NotReady, PromptRejected
from kael_server.jobs import Failed, Finished, Job, Outcome, PromptAccepted, SamplingParams
from kael_server.metrics import Metrics
from kael_server.output import JobOutput
from kael_server.protocols import Model, RngFactory, Tokenizer
from kael_server.scheduler import Scheduler, SlotPool


class Generator:
    """Serves ``model`` through a Scheduler (one generation slot by default).

    ``make_rng(seed)`` builds the ``generator`` argument of ``model.generate`` for seeded
    requests; without it, requests are sampled from the model's default random state.
    ``shutting_down`` is set once the server starts draining: no new job is admitted and the
    running ones are cancelled. ``make_scheduler(generator)`` replaces the single-slot
    SlotPool (a batching scheduler needs the generator's model and tokenizer).
    """

    def __init__(
        self,
        model: Model,
        tokenizer: Tokenizer,
        *,
        device: str = "cpu",
        model_name: str = "kael-gpt2",
        make_rng: RngFactory | None = None,
        metrics: Metrics | None = None,
        make_scheduler: Callable[[Generator], Scheduler] | None = None,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.device = device
        self.model_name = model_name
        self.context_length = int(model.max_positions)
        self.vocab_size = int(model.vocab_size)
        self.make_rng = make_rng
        self.metrics = metrics if metrics is not None else Metrics()
        self.scheduler = make_scheduler(self) if make_scheduler is not None else SlotPool(self.run)
        self.shutting_down = threading.Event()

    # ---- on the event loop ------------------------------------------------------------

    def submit(self, prompt: str, params: SamplingParams, arrived: float) -> Job:
        """Admits a generation now (raising Busy or NotReady otherwise); it runs on a worker."""
        if self.shutting_down.is_set():
            raise NotReady("the server is shutting down")
        job = Job(prompt, params, arrived, asyncio.get_running_loop())
        self.scheduler.submit(job)
        return job

    def begin_shutdown(self) -> None:
        """Refuses new jobs and stops the running ones at their next token."""
        self.shutting_down.set()
        for job in self.scheduler.running():
            job.cancel("shutdown")

    # ---- on a worker thread -----------------------------------------------------------

    def run(self, job: Job) -> Outcome:
        """Encodes the prompt and generates; every failure becomes a Failed outcome."""
        try:
            ids = self.prepare(job)
            self.accept(job, ids)
            return Finished(self._generate(job, ids))
        except Exception as exc:
            return Failed(exc)

    def prepare(self, job: Job) -> list[int]:
        """The prompt's token ids, checked against the context; raises PromptRejected or Cancelled."""
        ids = self.tokenizer.encode(job.prompt)
        if job.cancelled:
            raise Cancelled(job.cancel_reason or "client")
        self._check_prompt(ids, job.params.max_tokens)
        return ids

    def accept(self, job: Job, ids: list[int]) -> None:
        """The job will generate now: count its prompt and tell the client (a stream may start)."""
        job.stats.prompt_tokens = len(ids)
        self.metrics.prompt_tokens.inc(len(ids))
        job.emit(PromptAccepted(len(ids)))

    def rng_for(self, params: SamplingParams) -> object | None:
        """The ``generator`` argument of a job: seeded from its ``seed`` when it has one."""
        return self.make_rng(params.seed) if params.seed is not None and self.make_rng else None

    def _check_prompt(self, ids: list[int], max_tokens: int) -> None:
        if not ids:
            raise PromptRejected(422, "the prompt encodes to no tokens")
        if len(ids) + max_tokens > self.context_length:
            raise PromptRejected(
                413,
                f"prompt ({len(ids)} tokens) plus max_tokens ({max_tokens}) exceeds "
                f"the context of {self.context_length} tokens",
            )

    def _generate(self, job: Job, ids: list[int]) -> str:
        params, stats = job.params, job.stats
        output = JobOutput(job, self.tokenizer)
        rng = self.rng_for(params)
        start = time.perf_counter()
        try:
            self.model.generate(
                ids,
                params.max_tokens,
                temperature=params.temperature,
                top_k=min(params.top_k, self.vocab_size),
                on_token=output.on_token,
                generator=rng,
            )
        finally:
            stats.seconds = time.perf_counter() - start
            self.metrics.generation_finished(stats.tokens, stats.seconds, stats.ttft)
        return output.text()
