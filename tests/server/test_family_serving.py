"""Every built-in Llama-derived family (sliding windows shorter than the prompt where the family has them) behind ``kael-server``: a random checkpoint of each (transformers builds it
offline, with write_llama's ChatML tokenizer) served with two slots (continuous batching on the paged KV cache,
prefix caching on) answers a chat with the model's own greedy reply, and a second identical chat reuses the
first one's cached blocks and answers the same.

Oracles: transformers' ``apply_chat_template`` for the prompt ids, and the same checkpoint loaded in this
process generating greedily with ``kael.models.generate`` (each family's greedy tokens equal transformers':
tests/core/test_<family>.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from .chat_models import write_family
from .test_chat_models import MESSAGES, expected_reply, serve

kael = pytest.importorskip("kael")
pytest.importorskip("transformers")

BLOCK = 16  # kael-server's paged-cache block size (positions)
FAMILIES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "qwen3": ("Qwen3ForCausalLM", "Qwen3Config", {"head_dim": 16}),
    "granite": (
        "GraniteForCausalLM",
        "GraniteConfig",
        {"embedding_multiplier": 2.0, "residual_multiplier": 0.5, "attention_multiplier": 0.2, "logits_scaling": 2.0},
    ),
    "smollm3": ("SmolLM3ForCausalLM", "SmolLM3Config", {"no_rope_layer_interval": 2}),
    "olmo2": ("Olmo2ForCausalLM", "Olmo2Config", {}),
    "phi3": ("Phi3ForCausalLM", "Phi3Config", {"pad_token_id": None}),
    "qwen3_moe": ("Qwen3MoeForCausalLM", "Qwen3MoeConfig", {"num_experts": 4, "num_experts_per_tok": 2}),
    "gemma3_text": (
        "Gemma3ForCausalLM",
        "Gemma3TextConfig",
        {"sliding_window": 8, "layer_types": ["sliding_attention", "full_attention"], "head_dim": 16},
    ),
    "gemma2": ("Gemma2ForCausalLM", "Gemma2Config", {"sliding_window": 8, "head_dim": 16}),
}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    model_class, config_class, config = FAMILIES[request.param]
    return write_family(tmp_path_factory.mktemp(request.param) / request.param, model_class, config_class, **config)


def test_the_family_serves_its_greedy_reply_and_reuses_cached_blocks(family_dir: Path) -> None:
    assert kael.models.model_type_of(family_dir) == family_dir.name
    ids, text, finish = expected_reply(family_dir, MESSAGES, 12)
    body = {"messages": MESSAGES, "temperature": 0, "max_tokens": 12}
    with serve(family_dir, slots=2) as client:
        first = client.post("/v1/chat/completions", json=body)
        second = client.post("/v1/chat/completions", json=body)
    for response in (first, second):
        assert response.status_code == 200, response.text
        answer = response.json()
        assert answer["usage"]["prompt_tokens"] == len(ids)
        assert answer["choices"][0]["message"] == {"role": "assistant", "content": text}
        assert answer["choices"][0]["finish_reason"] == finish
    # the second prompt's full blocks were cached by the first (the last token is always computed)
    cached = second.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached == (len(ids) - 1) // BLOCK * BLOCK > 0
