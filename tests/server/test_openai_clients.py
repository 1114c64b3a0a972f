"""Real clients against real ``kael-server`` processes serving the bundled kael-tiny (byte tokens, 128 context).

The official ``openai`` client and langchain-openai's ``OpenAI`` wrapper talk to the server
over sockets, single-slot and with ``--slots 3`` (batched: n choices forked from one prefill).
Oracles: the same checkpoint loaded in this process, run without a cache (``model(ids)``) on
every prefix, then NumPy's log-softmax and OpenAI's penalty formula, step by step.
"""

from __future__ import annotations

import contextlib
import json
import math
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest

from .processes import free_port

kael = pytest.importorskip("kael")
pytestmark = pytest.mark.e2e

PROMPT = "def fibonacci(n):\n"


class Served:
    def __init__(self, url: str, log: Path, process: subprocess.Popen[bytes]) -> None:
        self.url, self.log, self.process = url, log, process
        self.api = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)

    def log_events(self) -> list[dict[str, Any]]:
        lines = self.log.read_text().splitlines()
        return [json.loads(line) for line in lines if line.startswith("{")]


@contextlib.contextmanager
def kael_server(tmp: Path, *flags: str) -> Iterator[Served]:
    """``kael-server`` on the bundled model with ``flags``, its JSON log in a file (read at any time)."""
    port = free_port()
    command = [shutil.which("kael-server") or sys.executable]
    if command[0] == sys.executable:
        command += ["-m", "kael_server.cli"]
    command += ["--port", str(port), "--log-format", "json", *flags]
    log = tmp / f"server-{port}.log"
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert process.poll() is None, f"kael-server exited with {process.returncode}:\n{log.read_text()}"
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{url}/ready", timeout=1).status_code == 200:
                    break
            assert time.monotonic() < deadline, "kael-server did not become ready in time"
            time.sleep(0.1)
        yield Served(url, log, process)
    finally:
        process.terminate()
        try:
            process.wait(timeout=40)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture(scope="module", params=["1", "3"], ids=["single-slot", "slots-3"])
def served(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with kael_server(tmp_path_factory.mktemp("log"), "--slots", request.param) as server:
        yield server


@pytest.fixture(scope="module")
def model() -> Any:
    from kael_server.loading import bundled_model_dir

    return kael.models.from_pretrained(bundled_model_dir())


def full_logits(model: Any, ids: list[int]) -> np.ndarray:
    """Logits [T, V] at every position of ``ids``, one forward pass without a cache (float64)."""
    with kael.no_grad():
        return np.asarray(model(kael.tensor([ids], dtype=kael.int64)), dtype=np.float64)[0]


def log_softmax(x: np.ndarray) -> np.ndarray:
    m = x.max()
    return x - m - math.log(float(np.exp(x - m).sum()))


def token_id(name: str) -> int:
    """kael-tiny's byte token for a logprobs token name."""
    if name == "<|endoftext|>":
        return 256
    if name.startswith("bytes:"):
        return int(name[len("bytes:\\x") :], 16)
    (byte,) = name.encode()
    return byte


def name_of(token: int) -> str:
    if token == 256:
        return "<|endoftext|>"
    return chr(token) if token < 128 else f"bytes:\\x{token:02x}"


# ---- a default kael-server (no flags): one batch scheduler, a queue, the prefix cache -----------


def test_a_default_server_answers_four_concurrent_clients_and_reuses_a_prompts_prefix(tmp_path: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    prompts = [f"{PROMPT}    # variant {i}\n" for i in range(4)]
    with kael_server(tmp_path) as server:

        def ask(prompt: str) -> Any:  # a client of its own, no retries: a 429 would fail the test
            api = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)
            return api.completions.create(model="kael-tiny", prompt=prompt, max_tokens=20, temperature=0)

        with ThreadPoolExecutor(4) as pool:
            together = list(pool.map(ask, prompts))
        alone = [ask(p) for p in prompts]  # each again, alone: greedy is the same, batched or not
        assert [c.choices[0].text for c in together] == [c.choices[0].text for c in alone]
        assert all(c.usage is not None and c.usage.completion_tokens == 20 for c in together)
        # the repeated prompts came from the prefix cache but for their last token: whole blocks and
        # then the start of the block their earlier run filled with its answer (NOTE [partial block])
        for prompt, c in zip(prompts, alone):
            details = c.usage.prompt_tokens_details if c.usage is not None else None
            assert details is not None and details.cached_tokens == len(prompt.encode()) - 1


# ---- the official openai client ----------------------------------------------------------------


def test_n_greedy_choices_are_identical(served: Served) -> None:
    completion = served.api.completions.create(model="kael-tiny", prompt=PROMPT, max_tokens=24, temperature=0, n=2)
    first, second = completion.choices
    assert (first.index, second.index) == (0, 1)
    assert first.text == second.text and len(first.text) > 0
    assert completion.usage is not None and completion.usage.completion_tokens == 2 * 24


def test_logprobs_and_echo_match_the_models_log_softmax(served: Served, model: Any) -> None:
    completion = served.api.completions.create(
        model="kael-tiny", prompt=PROMPT, max_tokens=20, temperature=0, logprobs=3, echo=True
    )
    (choice,) = completion.choices
    lp = choice.logprobs
    assert lp is not None and lp.tokens is not None and lp.token_logprobs is not None and lp.top_logprobs is not None
    assert choice.text.startswith(PROMPT)
    ids = [token_id(t) for t in lp.tokens]
    assert ids[: len(PROMPT)] == list(PROMPT.encode())
    assert len(ids) == len(PROMPT) + 20
    want = full_logits(model, ids)
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    for k in range(1, len(ids)):
        step = log_softmax(want[k - 1])  # the model's distribution for token k, given the tokens before it
        assert math.isclose(lp.token_logprobs[k], step[ids[k]], abs_tol=2e-4), k
        top = lp.top_logprobs[k]
        fourth = np.sort(step)[-4]
        for token in np.argsort(-step, kind="stable")[:3]:
            if step[token] > fourth + 1e-3:  # clearly in the top 3 (no float tie with the 4th)
                assert math.isclose(top[name_of(int(token))], step[token], abs_tol=2e-4), k
        assert len(top) in (3, 4) and name_of(ids[k]) in top
        if k >= len(PROMPT):  # a completion token: the greedy choice (up to a float tie)
            assert step[ids[k]] >= step.max() - 1e-3, k
    assert lp.text_offset == list(range(len(ids)))  # one character per byte token (ASCII)


def test_streaming_gives_the_plain_choices_and_logprobs(served: Served) -> None:
    request: dict[str, Any] = {"model": "kael-tiny", "prompt": PROMPT, "max_tokens": 16, "temperature": 0.8, "seed": 5}
    plain = served.api.completions.create(**request, n=2, logprobs=2)
    chunks = list(
        served.api.completions.create(**request, n=2, logprobs=2, stream=True, stream_options={"include_usage": True})
    )
    assert chunks[-1].usage is not None and plain.usage is not None
    assert chunks[-1].usage.completion_tokens == plain.usage.completion_tokens
    for want in plain.choices:
        mine = [c.choices[0] for c in chunks if c.choices and c.choices[0].index == want.index]
        assert "".join(c.text for c in mine) == want.text
        assert mine[-1].finish_reason == want.finish_reason
        tokens = [t for c in mine if c.logprobs and c.logprobs.tokens for t in c.logprobs.tokens]
        assert want.logprobs is not None and tokens == want.logprobs.tokens


def test_seeded_choices_use_seed_plus_index_whatever_runs_alongside(served: Served) -> None:
    api = served.api
    both = api.completions.create(model="kael-tiny", prompt=PROMPT, max_tokens=24, temperature=1.0, n=2, seed=100)
    alone = [
        api.completions.create(model="kael-tiny", prompt=PROMPT, max_tokens=24, temperature=1.0, seed=100 + i)
        .choices[0]
        .text
        for i in (0, 1)
    ]
    assert [c.text for c in both.choices] == alone
    assert alone[0] != alone[1]
    nucleus = {"top_p": 0.9, "presence_penalty": 0.3}
    pair = api.completions.create(
        model="kael-tiny", prompt=PROMPT, max_tokens=24, temperature=1.0, n=2, seed=7, **nucleus
    )
    again = api.completions.create(model="kael-tiny", prompt=PROMPT, max_tokens=24, temperature=1.0, seed=8, **nucleus)
    assert pair.choices[1].text == again.choices[0].text


def test_logit_bias_and_penalties_follow_openais_formulas(served: Served, model: Any) -> None:
    forced = served.api.completions.create(
        model="kael-tiny", prompt=PROMPT, max_tokens=6, temperature=1.0, logit_bias={"65": 100}
    )
    assert forced.choices[0].text == "AAAAAA"
    presence, frequency, repetition, bias = 0.6, 0.8, 1.3, {ord("x"): 2.0, ord(" "): -1.5}
    completion = served.api.completions.create(
        model="kael-tiny",
        prompt=PROMPT,
        max_tokens=30,
        temperature=0,
        presence_penalty=presence,
        frequency_penalty=frequency,
        extra_body={"repetition_penalty": repetition},
        logit_bias={str(k): v for k, v in bias.items()},
        logprobs=0,
    )
    lp = completion.choices[0].logprobs
    assert lp is not None and lp.tokens is not None
    out = [token_id(t) for t in lp.tokens]
    prompt = list(PROMPT.encode())
    logits = full_logits(model, prompt + out)
    plain = (
        served.api.completions.create(model="kael-tiny", prompt=PROMPT, max_tokens=30, temperature=0).choices[0].text
    )
    assert completion.choices[0].text != plain  # the penalties changed the text
    for k, token in enumerate(out):
        x = logits[len(prompt) + k - 1].copy()  # the logits before output token k
        for j, b in bias.items():
            x[j] += b
        seen = set(prompt) | set(out[:k])
        for j in range(len(x)):
            c = out[:k].count(j)
            if j in seen:
                x[j] = x[j] / repetition if x[j] > 0 else x[j] * repetition
            x[j] -= c * frequency + (c > 0) * presence
        assert x[token] >= x.max() - 1e-3, (k, token, int(np.argmax(x)))  # the argmax, up to float rounding


# ---- langchain-openai, raw bodies, seeds across processes ----------------------------------------


def test_langchain_openai_wrapper_with_its_default_parameters(served: Served) -> None:
    from langchain_openai import OpenAI

    # its defaults (temperature 0.7, top_p 1, frequency_penalty 0, presence_penalty 0, n 1,
    # logit_bias, seed and logprobs null, a prompt list) except max_tokens: 256 > kael-tiny's 128 context
    llm = OpenAI(base_url=f"{served.url}/v1", api_key="unused", max_tokens=24, max_retries=0, model="kael-tiny")
    text = llm.invoke(PROMPT)
    assert isinstance(text, str) and len(text) > 0
    results = llm.generate([PROMPT, "import "])
    assert len(results.generations) == 2 and all(g[0].text for g in results.generations)
    assert "".join(chunk for chunk in llm.stream("class ")) != ""
    greedy = OpenAI(
        base_url=f"{served.url}/v1", api_key="unused", max_tokens=12, temperature=0, max_retries=0, model="kael-tiny"
    )
    want = served.api.completions.create(model="kael-tiny", prompt=PROMPT, max_tokens=12, temperature=0).choices[0].text
    assert greedy.invoke(PROMPT) == want
    assert not [e for e in served.log_events() if e.get("event") == "unknown_fields_ignored"]


def test_langchain_openai_wrapper_with_every_default_on_a_model_with_room_for_them(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """langchain's defaults untouched (max_tokens 256 included) on a random GPT-2 with a 512-token context."""
    from kael_server.loading import bundled_model_dir
    from langchain_openai import OpenAI

    directory = tmp_path_factory.mktemp("ctx512") / "gpt2-512"
    kael.GPT(257, 512, 2, 2, 32, generator=kael.Generator().manual_seed(3)).save_pretrained(directory)
    for name in ("vocab.json", "merges.txt"):
        shutil.copyfile(bundled_model_dir() / name, directory / name)
    with kael_server(tmp_path_factory.mktemp("log512"), "--data", str(directory), "--slots", "2") as server:
        llm = OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, model="gpt2-512")
        assert llm.max_tokens == 256 and llm.temperature == 0.7  # the defaults, as sent
        text = llm.invoke(PROMPT)
        assert isinstance(text, str)
        usage = server.api.completions.create(model="gpt2-512", prompt=PROMPT, max_tokens=256, seed=1).usage
        assert usage is not None and 0 < usage.completion_tokens <= 256
        assert not [e for e in server.log_events() if e.get("event") == "unknown_fields_ignored"]


def test_a_raw_body_with_unknown_fields_gets_200_and_a_warning(served: Served) -> None:
    body = {
        "prompt": PROMPT,
        "max_tokens": 4,
        "frequency_penalty": 0,
        "presence_penalty": 0,
        "logit_bias": {},
        "response_format": {"type": "json_object"},
        "guided_regex_zq": "a+",
    }
    response = httpx.post(f"{served.url}/v1/completions", json=body, timeout=60)
    assert response.status_code == 200 and response.json()["choices"][0]["text"]
    request_id = response.headers["x-request-id"]
    warnings = [e for e in served.log_events() if e.get("event") == "unknown_fields_ignored"]
    assert [(w["fields"], w["request_id"], w["level"]) for w in warnings] == [
        (["guided_regex_zq"], request_id, "warning")  # response_format is kael's (enforced), not unknown
    ]
    assert response.json()["choices"][0]["text"].startswith("{")
    assert "a+" not in served.log.read_text()  # names, never values


def test_unseeded_sampling_differs_across_processes_and_seeded_does_not(tmp_path: Path, served: Served) -> None:
    if served.process.args[-1] != "1":  # one pair of processes is enough: the single-slot one and a fresh one
        pytest.skip("run once, with the single-slot server")
    request = {"model": "kael-tiny", "prompt": PROMPT, "max_tokens": 40, "temperature": 1.0}
    with kael_server(tmp_path, "--slots", "2") as other:
        first = [served.api.completions.create(**request).choices[0].text for _ in range(2)]
        second = other.api.completions.create(**request).choices[0].text
        assert len({*first, second}) == 3
        seeded = [s.api.completions.create(**request, seed=2024).choices[0].text for s in (served, other)]
        assert seeded[0] == seeded[1]
