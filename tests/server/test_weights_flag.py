"""``kael-server --weights`` (kael_server/cli.py, loading.py): the choices, the model it loads, what
``/v1/models`` reports, and the greedy text it serves (oracle: ``kael.models.generate`` on
``kael.models.from_pretrained(..., weights=...)`` of the same checkpoint)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from kael_server.cli import build_parser
from kael_server.loading import WEIGHTS, ServerConfigError, bundled_model_dir, load_app
from litestar import Litestar
from litestar.testing import TestClient

from .conftest import poll_until

kael = pytest.importorskip("kael")

PROMPT = "def fibonacci(n):\n"


def test_weights_choices_are_kaels() -> None:
    assert WEIGHTS == kael.models.WEIGHTS
    # every format kael can write and every llama.cpp mix, and only those
    assert set(WEIGHTS) == {"f32", *kael.quant.quantizable(), *kael.quant.formats.MIXES}
    assert build_parser().parse_args([]).weights is None
    assert build_parser().parse_args(["--weights", "q4_0"]).weights == "q4_0"


def test_an_unknown_weights_format_is_refused() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "kael_server.cli", "--weights", "q7_0"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2
    assert "--weights: invalid choice: 'q7_0'" in result.stderr and "'q8_0'" in result.stderr
    with pytest.raises(
        ServerConfigError, match=r"--weights must be one of \['f32', .*'q4_0', .*'q4_k_m', .*\], got 'int8'"
    ):
        load_app(None, weights="int8")


def test_help_lists_the_weights_flag() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "kael_server.cli", "--help"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0 and f"--weights {{{','.join(WEIGHTS)}}}" in result.stdout


@pytest.fixture(scope="module", params=["q8_0", "q4_0"])
def served(request: pytest.FixtureRequest) -> Iterator[tuple[str, TestClient[Litestar]]]:
    with TestClient(load_app(None, weights=request.param)) as c:
        assert poll_until(lambda: c.get("/ready").status_code == 200, timeout=120), c.get("/ready").text
        yield request.param, c


def test_models_reports_the_weights(served: tuple[str, TestClient[Litestar]]) -> None:
    scheme, client = served
    card = client.get("/v1/models").json()["data"][0]
    assert card["weights"] == scheme and card["id"] == "kael-tiny"


def test_completions_are_the_quantized_models_greedy_text(served: tuple[str, TestClient[Litestar]]) -> None:
    scheme, client = served
    d = bundled_model_dir()
    model = kael.models.from_pretrained(d, weights=scheme)
    tokenizer = kael.tokenizer.load_tokenizer(d)
    ids = tokenizer.encode(PROMPT)
    new = kael.models.generate(model, ids, 32)
    kept = new[: next((i for i, t in enumerate(new) if t == tokenizer.eot_token), len(new))]
    response = client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 32, "temperature": 0})
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["text"] == tokenizer.decode_text(kept)
    # the float model's text differs somewhere in 32 tokens at q4_0 (else the flag did nothing visible)
    if scheme == "q4_0":
        float_new = kael.models.generate(kael.models.from_pretrained(d), ids, 32)
        assert float_new != new


def test_float_model_reports_f32() -> None:
    with TestClient(load_app(None)) as c:
        assert poll_until(lambda: c.get("/ready").status_code == 200, timeout=120), c.get("/ready").text
        assert c.get("/v1/models").json()["data"][0]["weights"] == "f32"


def test_weights_on_a_gguf_file(tmp_path: Path) -> None:
    """``--data model.gguf --weights q8_0``: the file's float weights are quantized on load."""
    d = bundled_model_dir("kael-tiny-chat")
    path = tmp_path / "chat-f32.gguf"
    kael.models.save_gguf(kael.models.from_pretrained(d), path, kael.tokenizer.load_tokenizer(d))
    with TestClient(load_app(path, weights="q8_0")) as c:
        assert poll_until(lambda: c.get("/ready").status_code == 200, timeout=120), c.get("/ready").text
        assert c.get("/v1/models").json()["data"][0]["weights"] == "q8_0"
