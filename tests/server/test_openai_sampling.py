"""/v1/completions' sampling fields with fake models, against NumPy oracles written here.

The fakes' logits after a context are ``fakes.fake_logits(context)`` (their argmax is the fakes'
greedy letter), so every logprob, penalty and bias can be recomputed independently: OpenAI's
penalty formula, vLLM's repetition penalty, log-softmax in float64. Single-slot and batched
servers must give the same answers (NOTE [batch isolation]).
"""

from __future__ import annotations

import math
import random
from typing import Any

import numpy as np
import pytest
import structlog
from kael_server.batching import BatchScheduler
from litestar import Litestar
from litestar.testing import TestClient

from kael_server import Generator, create_app

from .conftest import sse_payloads
from .fake_batch_engine import FakeBatchEngine
from .fakes import EOT, ByteTokenizer, FakeModel, fake_logits, greedy_letter


def single(model: FakeModel | None = None) -> Litestar:
    return create_app(Generator(model or FakeModel(), ByteTokenizer(), make_rng=random.Random))


def batched(engine: FakeBatchEngine, queue: int = 0) -> Litestar:
    scheduler = lambda g: BatchScheduler(g, engine, queue=queue)  # noqa: E731
    return create_app(Generator(FakeModel(), ByteTokenizer(), make_rng=random.Random, make_scheduler=scheduler))


@pytest.fixture(params=["single", "batched"])
def client(request: pytest.FixtureRequest) -> Any:
    app = single() if request.param == "single" else batched(FakeBatchEngine(4))
    with TestClient(app) as test_client:
        yield test_client


def complete(client: TestClient[Litestar], **body: Any) -> Any:
    response = client.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def oracle_log_softmax(x: np.ndarray) -> np.ndarray:
    m = float(np.max(x))
    return np.array([v - m - math.log(math.fsum(math.exp(w - m) for w in x)) for v in x])


def name(token: int) -> str:
    """How the logprobs answer names a byte token (OpenAI's ``bytes:`` for a partial character)."""
    if token == EOT:
        return "<|endoftext|>"
    return chr(token) if token < 128 else f"bytes:\\x{token:02x}"


def greedy_oracle(
    prompt: bytes,
    steps: int,
    *,
    bias: dict[int, float] | None = None,
    presence: float = 0.0,
    frequency: float = 0.0,
    repetition: float = 1.0,
) -> list[int]:
    """Greedy decoding of the fakes' logits with OpenAI's penalties and bias, one token at a time."""
    context, out, seen = list(prompt), [], set(prompt)
    for _ in range(steps):
        x = fake_logits(context).tolist()
        for j in range(len(x)):
            x[j] += (bias or {}).get(j, 0.0)
            c = out.count(j)
            if j in seen or c:
                x[j] = x[j] / repetition if x[j] > 0 else x[j] * repetition
            x[j] -= c * frequency + (c > 0) * presence
        token = max(range(len(x)), key=lambda j: (x[j], -j))
        if token == EOT:
            break
        out.append(token)
        context.append(token)
    return out


# ---- choices and prompts -------------------------------------------------------------------


def test_n_greedy_choices_are_identical_and_numbered(client: TestClient[Litestar]) -> None:
    body = complete(client, prompt="ab", max_tokens=6, temperature=0, n=3)
    want = "".join(chr(t) for t in greedy_oracle(b"ab", 6))
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    assert [c["text"] for c in body["choices"]] == [want] * 3
    assert body["usage"] == {
        "prompt_tokens": 2,
        "completion_tokens": 18,
        "total_tokens": 20,
        "prompt_tokens_details": {"cached_tokens": 0},
    }


def test_seeded_choices_use_seed_plus_index(client: TestClient[Litestar]) -> None:
    body = complete(client, prompt="p", max_tokens=12, temperature=1.0, n=3, seed=40)
    texts = [c["text"] for c in body["choices"]]
    for i, text in enumerate(texts):  # the fakes draw letters from random.Random(seed)
        rng = random.Random(40 + i)
        assert text == "".join(chr(97 + rng.randrange(26)) for _ in range(12))
    assert len(set(texts)) == 3
    alone = [
        complete(client, prompt="p", max_tokens=12, temperature=1.0, seed=40 + i)["choices"][0]["text"]
        for i in range(3)
    ]
    assert alone == texts


def test_seeded_choices_with_kael_sampling_use_seed_plus_index(client: TestClient[Litestar]) -> None:
    body = complete(client, prompt="q", max_tokens=10, temperature=0.9, top_p=0.9, n=2, seed=7)
    alone = [complete(client, prompt="q", max_tokens=10, temperature=0.9, top_p=0.9, seed=7 + i) for i in range(2)]
    assert [c["text"] for c in body["choices"]] == [a["choices"][0]["text"] for a in alone]


def test_a_list_of_prompts_numbers_choices_prompt_by_prompt(client: TestClient[Litestar]) -> None:
    body = complete(client, prompt=["ab", "xyz"], max_tokens=4, temperature=0, n=2)
    want = ["".join(chr(t) for t in greedy_oracle(p, 4)) for p in (b"ab", b"xyz")]
    assert [(c["index"], c["text"]) for c in body["choices"]] == [
        (0, want[0]),
        (1, want[0]),
        (2, want[1]),
        (3, want[1]),
    ]
    assert body["usage"]["prompt_tokens"] == 5


def test_token_id_prompts_are_taken_as_they_are(client: TestClient[Litestar]) -> None:
    text = complete(client, prompt="hi", max_tokens=5, temperature=0)["choices"][0]["text"]
    assert complete(client, prompt=[104, 105], max_tokens=5, temperature=0)["choices"][0]["text"] == text
    both = complete(client, prompt=[[104, 105], [120]], max_tokens=5, temperature=0, echo=True)
    assert [c["text"] for c in both["choices"]] == ["hi" + text, "x" + "".join(chr(t) for t in greedy_oracle(b"x", 5))]
    too_big = client.post("/v1/completions", json={"prompt": [104, 257]})
    assert too_big.status_code == 400 and too_big.json()["error"]["param"] == "prompt"


# ---- logprobs and echo ---------------------------------------------------------------------


def test_logprobs_are_the_models_log_softmax(client: TestClient[Litestar]) -> None:
    body = complete(client, prompt="ab", max_tokens=5, temperature=0, logprobs=3)
    (choice,) = body["choices"]
    lp = choice["logprobs"]
    context = list(b"ab")
    for i, token in enumerate(greedy_oracle(b"ab", 5)):
        want = oracle_log_softmax(fake_logits(context))
        assert lp["tokens"][i] == name(token)
        assert math.isclose(lp["token_logprobs"][i], want[token], abs_tol=1e-9)
        top3 = sorted(range(len(want)), key=lambda j: (-want[j], j))[:3]
        assert set(lp["top_logprobs"][i]) == {name(t) for t in top3} | {name(token)}
        for t in top3:
            assert math.isclose(lp["top_logprobs"][i][name(t)], want[t], abs_tol=1e-9)
        context.append(token)
    assert lp["text_offset"] == [0, 1, 2, 3, 4]
    assert choice["text"] == "".join(lp["tokens"])


def test_echo_returns_the_prompt_and_its_logprobs(client: TestClient[Litestar]) -> None:
    body = complete(client, prompt="abc", max_tokens=2, temperature=0, echo=True, logprobs=1)
    (choice,) = body["choices"]
    completion = "".join(chr(t) for t in greedy_oracle(b"abc", 2))
    assert choice["text"] == "abc" + completion
    lp = choice["logprobs"]
    assert lp["tokens"] == ["a", "b", "c", *completion]
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    for k in (1, 2):  # prompt token k given the prompt before it
        want = oracle_log_softmax(fake_logits(list(b"abc"[:k])))
        assert math.isclose(lp["token_logprobs"][k], want[b"abc"[k]], abs_tol=1e-9)
        best = int(np.argmax(want))
        assert lp["top_logprobs"][k] == {
            name(best): pytest.approx(want[best]),
            name(b"abc"[k]): pytest.approx(want[b"abc"[k]]),
        }
    assert lp["text_offset"] == [0, 1, 2, 3, 4]
    only_prompt = complete(client, prompt="abc", max_tokens=0, echo=True, logprobs=0)["choices"][0]
    assert only_prompt["text"] == "abc" and only_prompt["logprobs"]["tokens"] == ["a", "b", "c"]
    assert complete(client, prompt="abc", max_tokens=3, echo=True)["choices"][0]["text"].startswith("abc")


def test_streamed_choices_and_logprobs_add_up_to_the_plain_answer(client: TestClient[Litestar]) -> None:
    request = {"prompt": "ab", "max_tokens": 6, "temperature": 0.8, "seed": 3, "n": 2, "logprobs": 2, "echo": True}
    plain = complete(client, **request)
    response = client.post(
        "/v1/completions", json={**request, "stream": True, "stream_options": {"include_usage": True}}
    )
    events = sse_payloads(response.text)
    assert events[-1] == "[DONE]" and events[-2]["usage"] == plain["usage"]
    for want in plain["choices"]:
        mine = [e["choices"][0] for e in events[:-2] if e["choices"][0]["index"] == want["index"]]
        assert "".join(c["text"] for c in mine) == want["text"]
        assert mine[-1]["finish_reason"] == want["finish_reason"]
        logprobs = [c["logprobs"] for c in mine if c["logprobs"]]
        for key in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
            assert [v for lp in logprobs for v in lp[key]] == want["logprobs"][key]


# ---- penalties, bias, nucleus, token limits ------------------------------------------------


def test_logit_bias_forces_and_bans_tokens(client: TestClient[Litestar]) -> None:
    forced = complete(client, prompt="ab", max_tokens=5, temperature=1.0, logit_bias={"90": 100})
    assert forced["choices"][0]["text"] == "ZZZZZ"
    greedy = greedy_letter(list(b"ab"))
    banned = complete(client, prompt="ab", max_tokens=4, temperature=0, logit_bias={str(greedy): -100})
    want = greedy_oracle(b"ab", 4, bias={greedy: -100})
    assert banned["choices"][0]["text"] == bytes(want).decode("utf-8", "replace") and want[0] != greedy


@pytest.mark.parametrize(
    ("presence", "frequency", "repetition"), [(1.5, 0.0, 1.0), (0.0, 2.0, 1.0), (-0.5, 0.7, 1.0), (0.0, 0.0, 1.8)]
)
def test_penalties_follow_openais_formula(
    client: TestClient[Litestar], presence: float, frequency: float, repetition: float
) -> None:
    body = complete(
        client,
        prompt="hello",
        max_tokens=40,
        temperature=0,
        presence_penalty=presence,
        frequency_penalty=frequency,
        repetition_penalty=repetition,
        logprobs=0,
    )
    want = greedy_oracle(b"hello", 40, presence=presence, frequency=frequency, repetition=repetition)
    assert body["choices"][0]["logprobs"]["tokens"] == [name(t) for t in want]
    assert want != greedy_oracle(b"hello", 40)  # the penalties did change the text (it repeats letters)


def test_top_p_and_min_p_sample_inside_the_nucleus(client: TestClient[Litestar]) -> None:
    body = complete(client, prompt="ab", max_tokens=8, temperature=1.0, top_p=0.3, min_p=0.05, seed=11, logprobs=0)
    again = complete(client, prompt="ab", max_tokens=8, temperature=1.0, top_p=0.3, min_p=0.05, seed=11, logprobs=0)
    assert again["choices"] == body["choices"]
    context = list(b"ab")
    for token_name in body["choices"][0]["logprobs"]["tokens"]:
        token = int(token_name[8:], 16) if token_name.startswith("bytes:") else ord(token_name)
        probs = np.exp(oracle_log_softmax(fake_logits(context)))
        order = sorted(range(len(probs)), key=lambda j: -probs[j])
        nucleus, total = set(), 0.0
        for j in order:
            if total >= 0.3:
                break
            nucleus.add(j)
            total += probs[j]
        assert token in nucleus and probs[token] >= 0.05 * probs.max()
        context.append(token)


def test_min_tokens_holds_back_the_end_of_text_and_ignore_eos_goes_past_it(client: TestClient[Litestar]) -> None:
    eot = {str(EOT): 100}  # end of text is all but certain at every step
    assert complete(client, prompt="ab", max_tokens=9, temperature=0, logit_bias=eot)["choices"][0]["text"] == ""
    held = complete(client, prompt="ab", max_tokens=9, temperature=0, logit_bias=eot, min_tokens=4)
    assert held["usage"]["completion_tokens"] == 4 and held["choices"][0]["finish_reason"] == "stop"
    assert held["choices"][0]["text"] == "".join(name(t) for t in greedy_oracle(b"ab", 4, bias={EOT: -math.inf}))
    ignored = complete(client, prompt="ab", max_tokens=5, temperature=0, logit_bias=eot, ignore_eos=True, logprobs=0)
    (choice,) = ignored["choices"]
    assert choice["finish_reason"] == "length" and ignored["usage"]["completion_tokens"] == 5
    assert choice["text"] == "" and choice["logprobs"]["tokens"] == ["<|endoftext|>"] * 5  # counted, not shown


def test_stop_strings_wait_for_min_tokens() -> None:
    with TestClient(single(FakeModel(script=b"ab.cd.ef"))) as client:
        assert complete(client, prompt="x", max_tokens=8, stop=".")["choices"][0]["text"] == "ab"
        # vLLM's rule: stop strings are looked for once min_tokens tokens are out
        assert complete(client, prompt="x", max_tokens=8, stop=".", min_tokens=3)["choices"][0]["text"] == "ab"
        assert complete(client, prompt="x", max_tokens=8, stop=".", min_tokens=4)["choices"][0]["text"] == "ab.cd"


# ---- the request schema ----------------------------------------------------------------------


def test_clients_defaults_and_nulls_are_accepted(client: TestClient[Litestar]) -> None:
    langchain_like = {
        "prompt": ["ab"],
        "model": "kael-gpt2",
        "temperature": 0.7,
        "top_p": 1,
        "frequency_penalty": 0,
        "presence_penalty": 0,
        "n": 1,
        "seed": None,
        "logprobs": None,
        "logit_bias": {},
        "max_tokens": 4,
        "best_of": 1,
        "suffix": None,
        "stream": None,
        "echo": None,
        "user": "someone",
    }
    body = complete(client, **langchain_like)
    assert len(body["choices"][0]["text"]) == 4 and body["choices"][0]["logprobs"] is None
    nulls = {k: None for k in ("max_tokens", "temperature", "top_p", "n", "top_k", "min_p", "min_tokens", "ignore_eos")}
    assert complete(client, prompt="ab", **nulls)["usage"]["completion_tokens"] == 16


def test_unknown_fields_are_ignored_and_named_in_a_warning(client: TestClient[Litestar]) -> None:
    with structlog.testing.capture_logs() as logs:
        body = complete(client, prompt="ab", max_tokens=2, temperature=0, guided_jsn={}, stream_options={"x_y": 1})
    assert body["choices"][0]["text"] == "".join(chr(t) for t in greedy_oracle(b"ab", 2))
    (warning,) = [e for e in logs if e["event"] == "unknown_fields_ignored"]
    assert warning["log_level"] == "warning"
    assert warning["fields"] == ["guided_jsn", "stream_options.x_y"]


BAD = {
    "logprobs 6": ({"logprobs": 6}, "logprobs"),
    "top_p 0": ({"top_p": 0}, "top_p"),
    "min_p over 1": ({"min_p": 1.5}, "min_p"),
    "presence over 2": ({"presence_penalty": 2.5}, "presence_penalty"),
    "frequency under -2": ({"frequency_penalty": -3}, "frequency_penalty"),
    "repetition 0": ({"repetition_penalty": 0}, "repetition_penalty"),
    "bias over 100": ({"logit_bias": {"5": 101}}, "logit_bias"),
    "bias key not an id": ({"logit_bias": {"abc": 1}}, "logit_bias"),
    "bias id beyond the vocabulary": ({"logit_bias": {"31337": 1}}, "logit_bias"),
    "n 0": ({"n": 0}, "n"),
    "best_of not n": ({"n": 2, "best_of": 3}, "best_of"),
    "suffix": ({"suffix": "zzq"}, "suffix"),
    "max_tokens 0 without echo": ({"max_tokens": 0}, "max_tokens"),
    "min_tokens over max_tokens": ({"max_tokens": 3, "min_tokens": 4}, "min_tokens"),
    "top_k -2": ({"top_k": -2}, "top_k"),
    "seed beyond int64": ({"seed": 2**63}, "seed"),
    "too many choices": ({"prompt": ["a", "b", "c"], "n": 6}, "n"),
    "mixed prompt list": ({"prompt": ["a", 5]}, "prompt"),
}


@pytest.mark.parametrize(("extra", "param"), BAD.values(), ids=BAD.keys())
def test_values_out_of_range_are_400_naming_the_field(
    client: TestClient[Litestar], extra: dict[str, Any], param: str
) -> None:
    response = client.post("/v1/completions", json={"prompt": "ab", **extra})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error"
    for echo in ("zzq", "31337", "abc", "101", "9223372036854775808"):
        assert echo not in response.text


@pytest.mark.parametrize("prompt", ["", [], [""], [[]], ["a", ""]])
def test_an_empty_prompt_is_refused_as_empty(client: TestClient[Litestar], prompt: Any) -> None:
    response = client.post("/v1/completions", json={"prompt": prompt})
    assert response.status_code == 400
    assert response.json()["error"] == {
        "message": "prompt: the prompt is empty",
        "type": "invalid_request_error",
        "param": "prompt",
        "code": None,
    }
    generate = client.post("/generate", json={"prompt": ""})
    assert generate.status_code == 422 and generate.json()["errors"] == [
        {"loc": "prompt", "msg": "the prompt is empty"}
    ]


def test_models_list_the_context_length() -> None:
    with TestClient(single(FakeModel(max_positions=77))) as client:
        (card,) = client.get("/v1/models").json()["data"]
        assert card["max_model_len"] == 77 and card["object"] == "model"


def test_negative_seeds_are_seeds(client: TestClient[Litestar]) -> None:
    runs = [complete(client, prompt="p", max_tokens=8, seed=-5)["choices"][0]["text"] for _ in range(2)]
    assert runs[0] == runs[1] != complete(client, prompt="p", max_tokens=8, seed=-6)["choices"][0]["text"]


def test_unseeded_requests_draw_fresh_entropy(client: TestClient[Litestar]) -> None:
    texts = {complete(client, prompt="p", max_tokens=16)["choices"][0]["text"] for _ in range(3)}
    assert len(texts) == 3
    nucleus = {complete(client, prompt="p", max_tokens=16, top_p=0.999)["choices"][0]["text"] for _ in range(3)}
    assert len(nucleus) == 3


def test_without_make_rng_unseeded_requests_still_draw_fresh_entropy() -> None:
    import kael

    model = FakeModel()
    with TestClient(create_app(Generator(model, ByteTokenizer()))) as client:
        texts = {complete(client, prompt="p", max_tokens=16)["choices"][0]["text"] for _ in range(3)}
        seeded = {complete(client, prompt="p", max_tokens=16, seed=5)["choices"][0]["text"] for _ in range(2)}
    assert len(texts) == 3 and len(seeded) == 1
    assert all(isinstance(call.generator, kael.Generator) for call in model.calls)
    assert len({call.generator.initial_seed() for call in model.calls[:3]}) == 3  # type: ignore[union-attr]
