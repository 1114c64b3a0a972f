"""What tests/core/test_qwen3.py, test_granite.py and test_smollm3.py share: the checks every Llama-derived
family added as a plugin passes against transformers' model of the same random checkpoint (logits on both CPU
backends, a right-padded batch, the KV cache, greedy generate, save_pretrained read back, half checkpoints)
and against the kael model's own forward pass or rows alone (the direct decode step, Q8_0 weights, the batched
decoder, the prefix cache); the fixture that gives them a (checkpoint, transformers model, kael model) per
shape (``pair_fixture``; the CPU ``backend`` fixture is tests/core/conftest.py's); and the config.json rewrites behind each
family's refusals (``write_config``, ``check_refused``).

Each check takes what differs between families: the kael class, its decode-step class, the checkpoint builder
and shapes, and a callback for the family's own assertions on a step or a saved config.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kael
import numpy as np
import pytest
from kael import _dispatch
from kael.models import BatchDecoder, GenericStep, decode_step, families, from_pretrained, get_family

__all__ = [
    "PROMPTS",
    "Builder",
    "Pair",
    "check_batched_rows",
    "check_decode_entries",
    "check_decode_step",
    "check_greedy_generate",
    "check_half_checkpoint",
    "check_incremental_cache",
    "check_logits",
    "check_parameter_names",
    "check_prefix_cache",
    "check_quantized_decode_step",
    "check_refused",
    "check_registered",
    "check_right_padded_batch",
    "check_save_pretrained",
    "hf_greedy",
    "hf_logits",
    "logits",
    "logits_moved",
    "pair_fixture",
    "write_config",
]

PROMPTS = [[3, 17, 42, 99, 5, 150, 7, 8, 1, 0, 199], [12], [60, 61, 62, 63] * 5]

#: (checkpoint directory, transformers model, kael model): what ``pair_fixture`` gives.
Pair = tuple[Path, Any, Any]
#: A family's ``build(directory, *, seed, save_dtype, **overrides)`` (its *_checkpoints.py).
Builder = Callable[..., Any]


def hf_logits(hf: Any, ids: list[list[int]], mask: Any = None) -> np.ndarray:
    """transformers' logits of the batch ``ids`` (with ``mask``), without gradients."""
    import torch

    with torch.no_grad():
        out: np.ndarray = hf(torch.tensor(ids), attention_mask=mask).logits.numpy()
    return out


def logits(model: Any, ids: list[int]) -> np.ndarray:
    """The kael model's logits of one sequence, without gradients."""
    with kael.no_grad():
        out: np.ndarray = model(kael.tensor([ids])).numpy()[0].copy()
    return out


def hf_greedy(hf: Any, ids: list[int], new: int) -> list[int]:
    """transformers' ``new`` greedy tokens after ``ids``."""
    import torch

    with torch.no_grad():
        x = torch.tensor([ids])  # the mask given: transformers would mask the prompt's pad-id tokens
        want = hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=new, do_sample=False, pad_token_id=0)
    out: list[int] = want[0, len(ids) :].tolist()
    return out


def logits_moved(hf: Any, base: np.ndarray) -> float:
    """How far (max |diff|) a transformers model rebuilt from ``hf.config`` as it is now, with ``hf``'s weights,
    moves the logits of ``PROMPTS[0]`` from ``base``."""
    other = type(hf)(hf.config).eval()
    other.load_state_dict(hf.state_dict())
    return float(np.abs(hf_logits(other, [PROMPTS[0]])[0] - base).max())


def pair_fixture(shapes: dict[str, dict[str, Any]], build: Builder, kael_class: type[Any]) -> Any:
    """A module-scoped fixture ``pair`` over ``shapes``: (checkpoint directory, transformers model, kael model)."""

    @pytest.fixture(scope="module", params=list(shapes))
    def pair(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Pair:
        """(checkpoint directory, transformers model, kael model) of one shape."""
        d = tmp_path_factory.mktemp(request.param)
        hf = build(d, seed=1, **shapes[request.param])
        model = from_pretrained(d)
        assert isinstance(model, kael_class)
        return d, hf, model

    return pair


def check_registered(name: str, *words: str) -> None:
    """The family ``name`` is registered, its description naming each of ``words``."""
    assert name in families()
    fam = get_family(name)
    assert all(w in fam.description for w in words), fam.description


def check_parameter_names(cfg: Any, hf: Any, model: Any) -> None:
    """The kael model's parameters are transformers' state dict's names and shapes (less a tied head)."""
    want = {k: tuple(v.shape) for k, v in hf.state_dict().items()}
    if cfg.tie_word_embeddings:
        want.pop("lm_head.weight")
    assert {k: tuple(p.shape) for k, p in model.named_parameters()} == want


def check_logits(pair: Pair) -> None:
    _, hf, model = pair
    for ids in PROMPTS:
        np.testing.assert_allclose(logits(model, ids), hf_logits(hf, [ids])[0], atol=1e-4, rtol=0)


def check_right_padded_batch(pair: Pair) -> None:
    import torch

    _, hf, model = pair
    t = max(len(p) for p in PROMPTS)
    ids = [p + [0] * (t - len(p)) for p in PROMPTS]
    mask = torch.tensor([[1] * len(p) + [0] * (t - len(p)) for p in PROMPTS])
    with kael.no_grad():
        got = model(kael.tensor(ids), lengths=[len(p) for p in PROMPTS]).numpy()
    want = hf_logits(hf, ids, mask)
    for i, p in enumerate(PROMPTS):
        np.testing.assert_allclose(got[i, : len(p)], want[i, : len(p)], atol=1e-4, rtol=0)


def check_incremental_cache(pair: Pair) -> None:
    _, hf, model = pair
    ids = PROMPTS[0] + PROMPTS[2]
    cache = model.new_cache()
    with kael.no_grad():
        steps = [model(kael.tensor([ids[:5]]), cache).numpy()[0]]
        steps += [model(kael.tensor([[t]]), cache).numpy()[0] for t in ids[5:]]
    np.testing.assert_allclose(np.concatenate(steps), hf_logits(hf, [ids])[0], atol=1e-4, rtol=0)


def check_greedy_generate(pair: Pair) -> None:
    _, hf, model = pair
    for ids in PROMPTS[:2]:
        assert model.generate(ids, 24) == hf_greedy(hf, ids, 24)


def _step_rows(model: Any, ids: list[int], prefill: int, direct: bool | None, step_class: type[Any], check: Any) -> Any:
    """Prefill ``ids[:prefill]``, then run the rest through ``decode_step`` one token at a time: the step's
    logits rows (``check(step, model)`` first, where the step is ``step_class``)."""
    cache = model.new_cache(max_positions=len(ids))
    with kael.no_grad():
        model(kael.tensor([ids[:prefill]]), cache)
        step = decode_step(model, cache) if direct is None else decode_step(model, cache, direct)
        is_direct = isinstance(step, step_class)
        if direct is None:
            assert is_direct
        else:
            assert is_direct == direct and isinstance(step, GenericStep) != direct
        if is_direct and check is not None:
            check(step, model)
        rows = []
        for t in ids[prefill:]:
            rows.append(step([0], [t]).numpy()[0].copy())
            cache.lengths[0] += 1
    return np.stack(rows)


def check_decode_step(
    pair: Pair,
    backend: str,
    direct: bool,
    kael_class: Any,
    step_class: type[Any],
    check: Callable[[Any, Any], None] | None = None,
    atol: float = 2e-5,
) -> None:
    """``decode_step`` (direct: ``step_class``, whose layers keep q/k/v apart exactly on a mapped load, and
    ``check(step, model)``; else the generic step) equals the model's own forward pass, fused or mapped (within
    ``atol``: the prefill's products of more than 16 rows may sum in another order than one row's)."""
    _, _, model = pair
    if direct and any(_dispatch.fused_kernel("cpu", op) is None for op in ("rms_norm", "rope", "silu_mul")):
        pytest.fail(f"the {backend!r} backend lacks rms_norm/rope/silu_mul kernels: no direct step to test")
    ids = [(7 * i + 3) % 200 for i in range(24)]
    for mapped in (False, True):  # a mapped load keeps q/k/v apart: the step's separate products

        def layers(step: Any, m: Any, mapped: bool = mapped) -> None:
            assert all((lay.qkv is None) == mapped for lay in step.layers)
            if check is not None:
                check(step, m)

        m = kael_class.from_pretrained(pair[0], mmap=mapped) if mapped else model
        rows = _step_rows(m, ids, 8, direct, step_class, layers)
        np.testing.assert_allclose(rows, logits(m, ids)[8:], atol=atol, rtol=0)


def check_quantized_decode_step(
    pair: Pair, step_class: type[Any], check: Callable[[Any, Any], None] | None = None
) -> None:
    """Q8_0 weights: the direct step (``step_class``, ``check(step, model)``) equals the model's forward pass."""
    model = from_pretrained(pair[0], weights="q8_0")
    ids = [(11 * i + 5) % 200 for i in range(16)]
    rows = _step_rows(model, ids, 6, None, step_class, check)
    np.testing.assert_allclose(rows, logits(model, ids)[6:], atol=2e-5, rtol=0)


def _greedy_together(engine: BatchDecoder, out: list[list[int]], more: int) -> list[list[int]]:
    """``more`` greedy tokens appended to each row of ``out`` (row i: engine row i), decoded together."""
    rows = list(range(len(out)))
    for _ in range(more):
        for o, t in zip(out, engine.greedy(engine.decode(rows, [o[-1] for o in out]))):
            o.append(t)
    return out


def check_batched_rows(pair: Pair) -> None:
    """BatchDecoder (paged cache, one block per row) rows of different lengths, joining late, equal each alone."""
    _, _, model = pair
    rng = np.random.default_rng(0)
    prompts = [[int(t) for t in rng.integers(0, 200, size=k)] for k in (1, 7, 12, 3)]
    alone = [model.generate(p, 12) for p in prompts]
    engine = BatchDecoder(model, rows=4)
    firsts = engine.prefill_many([0, 1, 2, 3], prompts)
    assert _greedy_together(engine, [[t] for t in engine.greedy(firsts)], 11) == alone


def check_decode_entries(pair: Pair, vocab: int = 200) -> None:
    """NOTE [entries at positions] (kael/models/_steps.py): rows fed several tokens in one ``decode_entries``
    pass (1, 12 and 9 tokens: 22 entries, so projections run in waves of 16) give, bit for bit, the logits of
    the same tokens decoded one step at a time, and the rows decode on from there alike. A step that takes no
    positions (``takes_positions`` False) is refused by ``decode_entries`` and ``allow_drafts`` says so."""
    _, _, model = pair
    rng = np.random.default_rng(1)
    prompts = [[int(t) for t in rng.integers(0, vocab, size=k)] for k in (3, 9, 5)]
    feeds = [[int(t) for t in rng.integers(0, vocab, size=k)] for k in (1, 12, 9)]
    one, many = BatchDecoder(model, rows=3), BatchDecoder(model, rows=3)
    one.prefill_many([0, 1, 2], prompts)
    many.prefill_many([0, 1, 2], prompts)
    if not getattr(many._step, "takes_positions", False):
        assert many.allow_drafts(12) is False
        with pytest.raises(kael.KaelError, match="takes one token per row"):
            many.decode_entries([0], [feeds[0][0]], [many.length(0)])
        return
    want = [[one.decode([r], [t]).numpy()[0].copy() for t in feed] for r, feed in enumerate(feeds)]
    assert many.allow_drafts(12) is True
    rows = [r for r, feed in enumerate(feeds) for _ in feed]
    pos = [len(prompts[r]) + j for r, feed in enumerate(feeds) for j in range(len(feed))]
    got = many.decode_entries(rows, [t for feed in feeds for t in feed], pos).numpy()
    assert np.array_equal(got, np.concatenate([np.stack(w) for w in want]))
    assert [many.length(r) for r in range(3)] == [len(p) + len(f) for p, f in zip(prompts, feeds)]
    nxt = [int(t) for t in rng.integers(0, vocab, size=3)]
    assert np.array_equal(many.decode([0, 1, 2], nxt).numpy(), one.decode([0, 1, 2], nxt).numpy())


def check_prefix_cache(pair: Pair, hit_tokens: int | None = None, atol: float = 1e-5) -> None:
    """Prompts sharing whole cached blocks: a hit's first logits equal a cold prefill's (within ``atol``), the rows
    decoded together give the tokens of each alone, and (``hit_tokens`` given) the cache counts that many hit
    tokens."""
    _, _, model = pair
    shared = [(5 * i + 2) % 200 for i in range(20)]
    prompts = [shared + [7, 8], shared + [9], shared[:17] + [11, 12, 13]]
    alone = [model.generate(p, 8) for p in prompts]
    warm = BatchDecoder(model, 3, block_size=8)
    cold = BatchDecoder(model, 1, prefix_caching=False)
    out = []
    for row, p in enumerate(prompts):
        first = warm.prefill(row, p)
        assert warm.cached_tokens(row) == (0 if row == 0 else 16)  # two whole blocks of 8 shared
        np.testing.assert_allclose(first.numpy(), cold.prefill(0, p).numpy(), rtol=0, atol=atol)
        cold.release(0)
        out.append(warm.greedy(kael.reshape(first, 1, model.vocab_size)))
    if hit_tokens is not None:
        assert warm.kv_stats()["prefix_hit_tokens"] == hit_tokens
    assert _greedy_together(warm, out, 7) == alone


def check_half_checkpoint(tmp_path: Path, save_dtype: str, build: Builder, shape: dict[str, Any]) -> None:
    """A checkpoint saved in ``save_dtype`` loads as float32 with the stored values, or as stored (dtype auto)."""
    import torch

    hf = build(tmp_path, seed=2, save_dtype=getattr(torch, save_dtype), **shape)
    model: Any = from_pretrained(tmp_path)
    assert model.dtype is kael.float32
    for name, p in model.named_parameters():
        want = hf.state_dict()[name].to(getattr(torch, save_dtype)).float().numpy()
        np.testing.assert_array_equal(p.detach().numpy(), want, err_msg=name)
    stored = from_pretrained(tmp_path, dtype="auto")
    assert stored.dtype is getattr(kael, save_dtype)


def check_save_pretrained(
    tmp_path: Path,
    pair: Pair,
    model_type: str,
    architecture: str,
    check: Callable[[dict[str, Any], Any], None] | None = None,
) -> None:
    """save_pretrained writes a ``model_type`` config.json of ``architecture`` (``check(config, hf)``) that
    transformers reads back as that class with the same logits, and kael too."""
    import transformers

    _, hf, model = pair
    model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model_type"] == model_type and config["architectures"] == [architecture]
    if check is not None:
        check(config, hf)
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert type(back).__name__ == architecture
    np.testing.assert_allclose(hf_logits(back, [PROMPTS[0]]), hf_logits(hf, [PROMPTS[0]]), atol=1e-6, rtol=0)
    np.testing.assert_array_equal(logits(from_pretrained(tmp_path), PROMPTS[0]), logits(model, PROMPTS[0]))


def write_config(tmp_path: Path, build: Builder, shape: dict[str, Any], **changes: Any) -> Path:
    """A checkpoint of ``shape`` in ``tmp_path`` whose config.json has ``changes``: its directory."""
    build(tmp_path, **shape)
    p = tmp_path / "config.json"
    d = json.loads(p.read_text())
    d.update(changes)
    p.write_text(json.dumps(d))
    return tmp_path


def check_refused(directory: Path, match: str, what: str) -> None:
    """from_pretrained refuses ``directory`` with a FormatError matching ``match`` that names the ``what``
    ("Qwen3 config", ...) and config.json."""
    with pytest.raises(kael.FormatError, match=match) as err:
        from_pretrained(directory)
    assert what in str(err.value) and "config.json" in str(err.value)
