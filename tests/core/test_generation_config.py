"""kael.models.read_generation_config against files transformers writes, and one malformed-file
test per field rule.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import kael
import pytest
from kael.models import GenerationConfig, read_generation_config

transformers = pytest.importorskip("transformers")


def test_missing_file_is_empty(tmp_path: Path) -> None:
    assert read_generation_config(tmp_path) == GenerationConfig()
    assert read_generation_config(tmp_path).eos_token_ids == ()


@pytest.mark.parametrize("eos", [7, [7, 9], []])
def test_transformers_generation_config(tmp_path: Path, eos: Any) -> None:
    hf = transformers.GenerationConfig(
        eos_token_id=eos,
        bos_token_id=3,
        pad_token_id=0,
        max_new_tokens=40,
        temperature=0.7,
        top_p=0.9,
        top_k=20,
        do_sample=True,
        repetition_penalty=1.1,
    )
    hf.save_pretrained(tmp_path)
    got = read_generation_config(tmp_path)
    want_eos = tuple(eos) if isinstance(eos, list) else (eos,)
    assert got == GenerationConfig(
        eos_token_ids=want_eos,
        bos_token_id=3,
        pad_token_id=0,
        max_length=None,
        max_new_tokens=40,
        temperature=0.7,
        top_p=0.9,
        top_k=20,
        do_sample=True,
        repetition_penalty=1.1,
    )
    # the file itself works as well as its directory
    assert read_generation_config(tmp_path / "generation_config.json") == got
    # and the values are the ones transformers reads back
    back = transformers.GenerationConfig.from_pretrained(tmp_path)
    assert got.top_k == back.top_k and got.temperature == back.temperature and got.max_new_tokens == back.max_new_tokens


def test_model_save_pretrained_writes_eos(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        bos_token_id=5,
        eos_token_id=[6, 8],
    )
    transformers.LlamaForCausalLM(cfg).save_pretrained(tmp_path)
    got = read_generation_config(tmp_path)
    assert got.eos_token_ids == (6, 8) and got.bos_token_id == 5
    assert got.temperature is None and got.do_sample is None


def test_unknown_fields_and_nulls_are_ignored(tmp_path: Path) -> None:
    (tmp_path / "generation_config.json").write_text(
        json.dumps({"eos_token_id": None, "top_k": None, "transformers_version": "5.0", "num_beams": 4})
    )
    assert read_generation_config(tmp_path) == GenerationConfig()


@pytest.mark.parametrize(
    "content, field",
    [
        ({"eos_token_id": "2"}, "eos_token_id"),
        ({"eos_token_id": [1, -2]}, "eos_token_id"),
        ({"eos_token_id": [1, True]}, "eos_token_id"),
        ({"eos_token_id": 1.0}, "eos_token_id"),
        ({"bos_token_id": -1}, "bos_token_id"),
        ({"pad_token_id": [0]}, "pad_token_id"),
        ({"max_length": 0}, "max_length"),
        ({"max_new_tokens": 2.5}, "max_new_tokens"),
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": "hot"}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -1}, "top_k"),
        ({"do_sample": 1}, "do_sample"),
        ({"repetition_penalty": 0}, "repetition_penalty"),
        ({"repetition_penalty": True}, "repetition_penalty"),
    ],
)
def test_bad_field_is_named(tmp_path: Path, content: dict[str, Any], field: str) -> None:
    (tmp_path / "generation_config.json").write_text(json.dumps(content))
    with pytest.raises(kael.FormatError, match=rf"generation_config\.json .*: {field}: expected"):
        read_generation_config(tmp_path)


def test_non_finite_number_is_refused(tmp_path: Path) -> None:
    (tmp_path / "generation_config.json").write_text('{"temperature": NaN}')
    with pytest.raises(kael.FormatError, match="temperature"):
        read_generation_config(tmp_path)


@pytest.mark.parametrize(
    "raw, match", [(b"{oops", "not UTF-8 JSON"), (b"\xff\xfe", "not UTF-8 JSON"), (b"[1]", "expected a JSON object")]
)
def test_malformed_file(tmp_path: Path, raw: bytes, match: str) -> None:
    (tmp_path / "generation_config.json").write_bytes(raw)
    with pytest.raises(kael.FormatError, match=rf"generation_config\.json.*{match}"):
        read_generation_config(tmp_path)


def test_unreadable_path_is_a_format_error(tmp_path: Path) -> None:
    (tmp_path / "generation_config.json").mkdir()
    with pytest.raises(kael.FormatError, match="generation_config.json"):
        read_generation_config(tmp_path)
