"""``kael-server --speculative ngram``: on the bundled models (GPT-2 kael-tiny and the Llama
kael-tiny-chat), a server that speculates answers every request with the same tokens and the
same logprobs as one that does not (greedy and seeded, with stop strings and n > 1): bit for bit
one at a time, and the same tokens with logprobs within 1e-5 eight at once (see below), its metrics count proposed and accepted drafts on a copy-heavy prompt, and
bad settings are refused in one line before it listens."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from kael_server.config import ServerConfig
from kael_server.loading import load_app
from litestar import Litestar
from litestar.testing import TestClient

from .conftest import poll_until
from .test_cli import refusal_line, run_cli

MODELS = Path(__file__).resolve().parents[2] / "kael_server" / "src" / "kael_server" / "models"
COPY = "def add(a, b):\n    return a + b\n\n"
PROMPTS = [COPY + "def add(a, b):\n", "the cat sat on the mat. " * 3, "Once upon a time", "1, 2, 3, 4, 5, 1, 2, 3,"]
"""Short enough for kael-tiny's 128 positions with 24 new tokens (it reads about a token a character)."""


def _client(stack: ExitStack, name: str, **settings: Any) -> TestClient[Litestar]:
    c = stack.enter_context(TestClient(load_app(ServerConfig(data=str(MODELS / name), slots=8, **settings))))
    assert poll_until(lambda: c.get("/ready").status_code == 200, timeout=120), c.get("/ready").text
    return c


SPECULATING = {
    "ngram": {"speculative": "ngram", "spec_tokens": 6},
    "draft": {"speculative": "draft", "draft_model": "SELF", "spec_tokens": 3},
}
"""A draft model: the served model itself (every draft right: the rejection paths are the
engine's tests' business)."""


@pytest.fixture(scope="module", params=[(m, s) for m in ("kael-tiny", "kael-tiny-chat") for s in SPECULATING])
def pair(request: pytest.FixtureRequest) -> Iterator[tuple[TestClient[Litestar], TestClient[Litestar]]]:
    name, method = request.param
    settings = {k: (str(MODELS / name) if v == "SELF" else v) for k, v in SPECULATING[method].items()}
    with ExitStack() as stack:
        yield _client(stack, name), _client(stack, name, **settings)


def _bodies() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i, prompt in enumerate(PROMPTS):
        out.append({"prompt": prompt, "max_tokens": 24, "temperature": 0, "logprobs": 2})
        out.append({"prompt": prompt, "max_tokens": 24, "temperature": 0.8, "seed": i, "n": 2, "logprobs": 1})
        out.append({"prompt": prompt, "max_tokens": 24, "temperature": 0, "stop": ["b\n", "mat"]})
    return out


def _answer(client: TestClient[Litestar], body: dict[str, Any]) -> list[tuple[str, str, Any]]:
    response = client.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    choices = response.json()["choices"]
    return [(c["text"], c["finish_reason"], c["logprobs"]) for c in choices]


def _metric(client: TestClient[Litestar], name: str) -> float:
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"no metric {name}")


def test_the_same_tokens_and_logprobs_alone_and_batched(
    pair: tuple[TestClient[Litestar], TestClient[Litestar]],
) -> None:
    plain, spec = pair
    bodies = _bodies()
    want = [_answer(plain, b) for b in bodies]
    assert [_answer(spec, b) for b in bodies] == want  # one at a time
    with ThreadPoolExecutor(8) as pool:  # eight at once: verification rows beside plain ones
        for got, expected in zip(pool.map(lambda b: _answer(spec, b), bodies), want, strict=True):
            assert [(t, f) for t, f, _ in got] == [(t, f) for t, f, _ in expected]
            for (_, _, lp), (_, _, lp_want) in zip(got, expected, strict=True):
                if lp_want is not None:
                    # a step of more than 16 rows (prompts prefilled beside decode rows) goes through
                    # the packed GEMM, which sums in another order than the few-row kernels: the
                    # plain server batched differs from alone by as much (a few 1e-7)
                    assert lp["tokens"] == lp_want["tokens"]
                    np.testing.assert_allclose(lp["token_logprobs"], lp_want["token_logprobs"], atol=1e-5, rtol=0)
    assert _metric(spec, "kael_spec_draft_tokens_total") > 0
    assert 0 < _metric(spec, "kael_spec_accepted_tokens_total") <= _metric(spec, "kael_spec_draft_tokens_total")
    assert 0 < _metric(spec, "kael_spec_acceptance_rate") <= 1
    assert _metric(plain, "kael_spec_draft_tokens_total") == 0


def test_the_spec_tokens_limit_is_the_engines() -> None:
    """kael-server's --spec-tokens limit (named in its config, which imports without kael) is the engine's."""
    from kael.engine import MAX_DRAFT_TOKENS
    from kael_server.config import MAX_SPEC_TOKENS

    assert MAX_SPEC_TOKENS == MAX_DRAFT_TOKENS


@pytest.mark.parametrize(
    ("flags", "line"),
    [
        (["--speculative", "ngram", "--spec-tokens", "0"], "argument --spec-tokens: must be at least 1, got 0"),
        (["--speculative", "ngram", "--spec-tokens", "100"], "argument --spec-tokens: must be at most 15, got 100"),
        (
            ["--speculative", "medusa"],
            "argument --speculative: invalid choice: 'medusa' (choose from 'ngram', 'draft')",
        ),
        (["--speculative", "draft"], "--speculative draft needs --draft-model DIR"),
        (["--draft-model", "kael-tiny"], "--draft-model needs --speculative draft"),
        (["--speculative", "draft", "--draft-model", "/nowhere"], "--draft-model '/nowhere' is not a directory"),
        (
            ["--speculative", "draft", "--draft-model", "kael-tiny-chat"],
            "--draft-model 'kael-tiny-chat': its vocabulary has",
        ),
    ],
)
def test_bad_speculation_settings_are_refused_before_listening(flags: list[str], line: str) -> None:
    assert line in refusal_line(run_cli(*flags))


def test_a_malformed_gguf_draft_model_is_refused_before_listening(tmp_path: Path) -> None:
    bad = tmp_path / "draft.gguf"
    bad.write_bytes(b"GGUF" + b"\x00" * 12)
    line = refusal_line(run_cli("--speculative", "draft", "--draft-model", str(bad)))
    assert line.startswith(f"kael-server: --draft-model {str(bad)!r}: cannot read its vocabulary size (")
