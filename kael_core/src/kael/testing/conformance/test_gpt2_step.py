"""A tiny GPT-2-like training step on the backend, compared with the same step on the reference backend.

embedding (tokens + positions) -> layer_norm -> attention (causal, heads split by a
transposed view) -> linear -> residual -> layer_norm -> gelu MLP -> tied lm head ->
cross_entropy, then backward: the loss and every parameter's gradient must match.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np

import kael
from kael.testing import assert_close

B, T, C, H, V = 2, 5, 8, 2, 11


def _params(rng: np.random.Generator) -> dict[str, np.ndarray]:
    def n(*s: int) -> np.ndarray:
        return np.asarray(rng.standard_normal(s) * 0.3, dtype=np.float32)

    return {
        "wte": n(V, C),
        "wpe": n(T, C),
        "ln1_w": 1 + n(C),
        "ln1_b": n(C),
        "attn_w": n(3 * C, C),
        "attn_b": n(3 * C),
        "proj_w": n(C, C),
        "proj_b": n(C),
        "ln2_w": 1 + n(C),
        "ln2_b": n(C),
        "fc_w": n(4 * C, C),
        "fc_b": n(4 * C),
        "fc2_w": n(C, 4 * C),
        "fc2_b": n(C),
        "lnf_w": 1 + n(C),
        "lnf_b": n(C),
    }


def _step(
    host: dict[str, np.ndarray], ids: np.ndarray, targets: np.ndarray, device: Any
) -> tuple[float, dict[str, np.ndarray]]:
    p = {k: kael.tensor(v, device=device, requires_grad=True) for k, v in host.items()}
    idx = kael.tensor(ids, device=device)
    x = kael.embedding(idx, p["wte"]) + kael.embedding(kael.arange(T, device=device), p["wpe"])
    h = kael.layer_norm(x, C, p["ln1_w"], p["ln1_b"])
    q, k, v = kael.linear(h, p["attn_w"], p["attn_b"]).split(C, 2)

    def heads(t: Any) -> Any:
        return t.view(B, T, H, C // H).transpose(1, 2)

    a = kael.attention(heads(q), heads(k), heads(v), causal=True).transpose(1, 2).reshape(B, T, C)
    x = x + kael.linear(a, p["proj_w"], p["proj_b"])
    m = kael.gelu(kael.linear(kael.layer_norm(x, C, p["ln2_w"], p["ln2_b"]), p["fc_w"], p["fc_b"]), "tanh")
    x = x + kael.linear(m, p["fc2_w"], p["fc2_b"])
    logits = kael.linear(kael.layer_norm(x, C, p["lnf_w"], p["lnf_b"]), p["wte"])
    loss = kael.cross_entropy(logits.view(B * T, V), kael.tensor(targets, device=device).view(-1))
    loss.backward()
    grads = {}
    for name, t in p.items():
        assert t.grad is not None, f"no gradient reached {name}"
        grads[name] = np.asarray(t.grad.detach().to("cpu").numpy(), dtype=np.float64)
    return float(loss.item()), grads


@contextlib.contextmanager
def _reference_cpu() -> Iterator[None]:
    prev = kael.backends.override("cpu")
    kael.backends.use("cpu", "reference")
    try:
        yield
    finally:
        kael.backends.use("cpu", prev)


def test_gpt2_step_matches_reference(kael_device: Any) -> None:
    rng = np.random.default_rng(2024)
    host = _params(rng)
    ids = rng.integers(0, V, size=(B, T))
    targets = rng.integers(0, V, size=(B, T))
    targets[0, 1] = -100  # an ignored position
    loss, grads = _step(host, ids, targets, kael_device)
    with _reference_cpu():
        ref_loss, ref_grads = _step(host, ids, targets, "cpu")
    assert_close(loss, ref_loss, rtol=1e-5, atol=1e-6, msg="GPT-2 step loss")
    assert 1.0 < ref_loss < 5.0
    for name in host:
        assert_close(grads[name], ref_grads[name], rtol=1e-4, atol=1e-5, msg=f"GPT-2 step gradient of {name}")
