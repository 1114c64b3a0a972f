"""JobOutput: what becomes of one job's generated token ids (text pieces, stop strings, stats).

Both schedulers feed it: the single slot through ``model.generate``'s ``on_token``, the
batch scheduler once per decode step. It runs on the thread that generates.
"""

from __future__ import annotations

import time

from kael.tokenizer import IncrementalDecoder

from kael_server.errors import Cancelled
from kael_server.jobs import Job, TextPiece
from kael_server.protocols import Tokenizer
from kael_server.stops import StopMatcher


class JobOutput:
    """Decodes tokens to whole UTF-8 characters, cuts at stop strings and emits the text pieces."""

    def __init__(self, job: Job, tokenizer: Tokenizer) -> None:
        self.job = job
        self.tokenizer = tokenizer
        self.eot = tokenizer.eot_token
        self.decoder = IncrementalDecoder(tokenizer)  # whole UTF-8 characters only
        self.stopper = StopMatcher(job.params.stop)
        self.pieces: list[str] = []
        self.interrupted = False

    def on_token(self, token: int) -> bool:
        """Handles one generated token; False once generation must stop (cancelled, end of text, stop string)."""
        job, stats = self.job, self.job.stats
        if job.cancelled:
            self.interrupted = True
            return False
        if token == self.eot:
            stats.finish_reason = "stop"
            return False
        stats.tokens += 1
        if stats.ttft is None:
            stats.ttft = time.perf_counter() - job.arrived
        self._send(self.stopper.feed(self.decoder.add(token)))
        if self.stopper.stopped:
            stats.finish_reason = "stop"
            return False
        return True

    def text(self) -> str:
        """The whole continuation once generation has ended; raises Cancelled if it was interrupted."""
        if self.interrupted:
            raise Cancelled(self.job.cancel_reason or "client")
        if not self.stopper.stopped:
            self._send(self.stopper.feed(self.decoder.flush()))
            self._send(self.stopper.flush())
        return "".join(self.pieces)

    def _send(self, text: str) -> None:
        if text:
            self.pieces.append(text)
            self.job.emit(TextPiece(text))
