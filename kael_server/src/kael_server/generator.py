"""Generator: the model, its tokenizer and everything needed to run one generation safely."""

from __future__ import annotations

import asyncio
import dataclasses
import secrets
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from kael import KaelError
from kael.engine import TokenSampler
from kael.tokenizer import IncrementalDecoder, encode_chat

from kael_server import limits
from kael_server.batching import BatchScheduler
from kael_server.errors import Cancelled, NotReady, PromptRejected, ServerConfigError
from kael_server.jobs import ChatPrompt, Job, Prompt, PromptAccepted, SamplingParams
from kael_server.metrics import Metrics
from kael_server.output import Choice, Echo, JobOutput, token_info
from kael_server.protocols import BatchEngine, ChatTemplate, Model, RngFactory, ServedModel, Tokenizer
from kael_server.scheduler import Scheduler

if TYPE_CHECKING:
    from kael.models import BatchDecoder

__all__ = ["Generator", "default_engine", "end_of_text_ids"]


class Generator:
    """Serves ``model`` through a Scheduler: by default kael's engine with one slot and no queue
    (a BatchScheduler over ``default_engine(model)``; one slot is a batch of one).

    Each sampled choice gets its own random generator, seeded with the request's ``seed``
    (choice ``i`` of a prompt: ``seed + i``, as vLLM numbers them) or, unseeded, with fresh
    entropy, so no two unseeded requests share a random stream, across restarts too.
    ``make_rng(seed)`` builds it for the engine's temperature/top-k draw (default: a seeded
    ``kael.Generator``, what kael's models take); a choice that needs kael's TokenSampler (penalties, bias, top-p,
    min-p, logprobs, min_tokens) always gets a seeded ``kael.Generator``.
    ``shutting_down`` is set once the server starts draining: no new job is admitted and the
    running ones are cancelled. ``make_scheduler(generator)`` replaces the default scheduler
    (``kael-server`` builds one of ``--slots`` rows and a ``--queue``).

    ``stop_tokens`` are the ids that end every text (default ``end_of_text_ids``: the
    tokenizer's end of text and the eos ids of ``model.generation_config``). ``chat_template``
    (default: the tokenizer's ``chat_template``, None without one) serves
    ``/v1/chat/completions``; a chat reply also ends at ``chat_stop_tokens`` (default: the
    template's ``end_of_turn_tokens(tokenizer)``). ``model_name`` and ``aliases`` are the names
    the OpenAI routes serve it under (``served_names``).
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
        stop_tokens: Sequence[int] | None = None,
        chat_template: ChatTemplate | None = None,
        chat_stop_tokens: Sequence[int] | None = None,
        aliases: Sequence[str] = (),
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.stop_tokens = tuple(stop_tokens) if stop_tokens is not None else end_of_text_ids(model, tokenizer)
        self.chat_template: ChatTemplate | None = (
            chat_template if chat_template is not None else tokenizer.chat_template
        )
        if chat_stop_tokens is None and self.chat_template is not None:
            chat_stop_tokens = self.chat_template.end_of_turn_tokens(tokenizer)
        self.chat_stop_tokens = tuple(chat_stop_tokens or ())
        self.device = device
        self.model_name = model_name
        self.served_names = tuple(dict.fromkeys((model_name, *aliases)))
        """Every name a request's ``model`` may give (``--served-model-name``); answers carry the one asked for."""
        self.context_length = int(model.max_positions)
        self.vocab_size = int(model.vocab_size)
        self.make_rng: RngFactory = make_rng if make_rng is not None else _kael_rng
        self.metrics = metrics if metrics is not None else Metrics()
        self.scheduler = (
            make_scheduler(self) if make_scheduler is not None else BatchScheduler(self, default_engine(model), slots=1)
        )
        self.shutting_down = threading.Event()

    # ---- on the event loop ------------------------------------------------------------

    def submit(self, prompts: Sequence[Prompt], params: SamplingParams, arrived: float) -> Job:
        """Admits a generation now (raising Busy or NotReady otherwise); it runs on a worker."""
        if self.shutting_down.is_set():
            raise NotReady("the server is shutting down")
        job = Job(tuple(prompts), params, arrived, asyncio.get_running_loop())
        self.scheduler.submit(job)
        return job

    def begin_shutdown(self) -> None:
        """Refuses new jobs and stops the running ones at their next token."""
        self.shutting_down.set()
        for job in self.scheduler.running():
            job.cancel("shutdown")

    # ---- on a worker thread -----------------------------------------------------------

    def prepare(self, job: Job) -> list[list[int]]:
        """Each prompt's token ids, checked against the context; raises PromptRejected or Cancelled.

        With ``params.fit_context``, ``job.params`` becomes the same with max_tokens at most
        what the context leaves after the longest prompt (PromptRejected if nothing is left)."""
        prompts = [self._encode(p) for p in job.prompts]
        if job.cancelled:
            raise Cancelled(job.cancel_reason or "client")
        if job.params.fit_context and prompts:
            room = self.context_length - max(len(ids) for ids in prompts)
            if room < 1:
                raise PromptRejected(
                    413,
                    f"the prompt ({max(len(ids) for ids in prompts)} tokens) leaves no room in the context "
                    f"of {self.context_length} tokens for a reply",
                )
            job.params = dataclasses.replace(job.params, max_tokens=min(job.params.max_tokens, max(room, 1)))
        for ids in prompts:
            self._check_prompt(ids, job.params.max_tokens)
        return prompts

    def _encode(self, prompt: Prompt) -> list[int]:
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt)
        if isinstance(prompt, ChatPrompt):
            return encode_chat(self.tokenizer, prompt.text)
        return list(prompt)

    def accept(self, job: Job, prompts: list[list[int]]) -> None:
        """The job will generate now: count its prompts and tell the client (a stream may start)."""
        count = sum(len(ids) for ids in prompts)
        job.stats.prompt_tokens = count
        self.metrics.prompt_tokens.inc(count)
        job.emit(PromptAccepted(count))

    def choices(self, job: Job, prompts: list[list[int]]) -> list[Choice]:
        """Every sequence of an accepted job, by index (NOTE [choices] in jobs.py), each with its
        output, random generator and sampler; an echoed prompt is sent now (with its logprobs,
        one forward pass of the model per prompt, shared by that prompt's choices)."""
        params = job.params
        out = []
        for p, ids in enumerate(prompts):
            echo = self._echo(job.prompts[p], ids, params) if params.echo else None
            for j in range(params.n):
                index = p * params.n + j
                own = self._sampler(params, ids, j)
                # temperature and top_k say everything: the model samples itself (make_rng's generator)
                sampler = None if own.simple else own
                rng = self.rng_for(params, j) if own.simple else own.generator
                output = JobOutput(job, self.tokenizer, index, sampler=sampler, echo=echo, end_tokens=self.stop_tokens)
                out.append(Choice(index, ids, output, sampler, rng))
        return out

    def rng_for(self, params: SamplingParams, choice: int = 0) -> object | None:
        """``model.generate``'s random generator for a prompt's choice number ``choice``: None
        when greedy, else ``make_rng(seed_for(params, choice))``."""
        if params.temperature == 0:
            return None
        return self.make_rng(self.seed_for(params, choice))

    @staticmethod
    def seed_for(params: SamplingParams, choice: int = 0) -> int:
        """``seed + choice``, or 63 bits of fresh entropy for an unseeded request."""
        return params.seed + choice if params.seed is not None else secrets.randbits(63)

    def _sampler(self, params: SamplingParams, ids: list[int], choice: int) -> TokenSampler:
        """The choice's kael sampler (its processors built from ``params``, its own seeded
        generator); ``sampler.simple`` says whether ``model.generate`` samples it alone. With
        ``params.constraint`` it masks every step to the grammar (compiled over this tokenizer,
        cached by its text), so a constrained choice is never simple."""
        rng = _kael_rng(self.seed_for(params, choice)) if params.temperature else None
        prompt = ids if params.repetition_penalty != 1 else ()
        sampler = TokenSampler(params, prompt, rng, end_tokens=self.stop_tokens, tokenizer=self.tokenizer)
        if sampler.matcher is not None:
            sampler.matcher.on_mask = self.metrics.mask_seconds.observe
        return sampler

    def _echo(self, prompt: Prompt, ids: list[int], params: SamplingParams) -> Echo:
        """The prompt as its choices' texts start: as given (text) or decoded (token ids)."""
        text = prompt if isinstance(prompt, str) else self.tokenizer.decode(ids).decode("utf-8", "replace")
        if params.logprobs is None:
            return Echo(text)
        from kael.models import prompt_logprobs

        records = prompt_logprobs(self.model, ids, params.logprobs)
        decoder, chars, tokens = IncrementalDecoder(self.tokenizer), 0, []
        for token, record in zip(ids, records):
            tokens.append(token_info(self.tokenizer, token, record, chars))
            chars += len(decoder.add(token))
        return Echo(text, tuple(tokens))

    def _check_prompt(self, ids: list[int], max_tokens: int) -> None:
        if not ids:
            raise PromptRejected(422, "the prompt encodes to no tokens")
        if len(ids) + max_tokens > self.context_length:
            raise PromptRejected(
                413,
                f"prompt ({len(ids)} tokens) plus max_tokens ({max_tokens}) exceeds "
                f"the context of {self.context_length} tokens",
            )


def default_engine(model: Model) -> BatchDecoder | BatchEngine:
    """The engine of a Generator built without a scheduler (one slot, no queue): kael's
    ``BatchDecoder`` over a kael model (a paged KV cache of one context, prefix cached), or the
    engine a ``ServedModel`` brings; rows for the widest request, which runs alone."""
    from kael.models import BatchDecoder, CausalLMBase

    rows = limits.MAX_PROMPTS * limits.MAX_CHOICES
    if isinstance(model, ServedModel):
        return model.engine(rows)
    if isinstance(model, CausalLMBase):
        return BatchDecoder(model, rows, kv_cache_tokens=int(model.max_positions))
    raise ServerConfigError(
        f"Generator: cannot serve a {type(model).__name__}: give a kael model (kael.models.CausalLMBase), a "
        "ServedModel, or make_scheduler"
    )


def end_of_text_ids(model: Model, tokenizer: Tokenizer) -> tuple[int, ...]:
    """The ids that end a generated text: the tokenizer's ``eot_token`` (when it has one) and
    every eos id of the model's ``generation_config`` (when it has one), in that order."""
    ids: list[int] = []
    try:
        ids.append(int(tokenizer.eot_token))
    except KaelError:  # a tokenizer with neither an eos token nor <|endoftext|>
        pass
    config = model.generation_config
    for token in config.eos_token_ids if config is not None else ():
        if int(token) not in ids:
            ids.append(int(token))
    return tuple(ids)


def _kael_rng(seed: int) -> Any:
    import kael  # on first use, as loading.py imports it

    return kael.Generator().manual_seed(seed)
