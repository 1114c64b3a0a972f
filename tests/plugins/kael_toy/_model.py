"""ToyLM: token and position embeddings, pre-norm attention + tanh feed-forward layers, a separate head.

Parameter names are its checkpoint keys (``embed_tokens.weight``, ``layers.0.qkv.weight``,
``lm_head.weight``, ...), so ``load`` is ``load_state_dict`` of the safetensors file.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import kael
from kael import nn
from kael.models import CausalLMBase, read_config_json

__all__ = ["ToyConfig", "ToyLM", "load", "save"]


@dataclass(frozen=True)
class ToyConfig:
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    max_position_embeddings: int


class ToyLayer(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.out = nn.Linear(dim, dim, bias=False)
        self.ff = nn.Linear(dim, dim)

    def forward(self, x: kael.Tensor, step: Any, layer: int) -> kael.Tensor:
        b, t, c = x.shape
        h = self.heads
        qkv = kael.view(self.qkv(self.norm(x)), b, t, 3, h, c // h)
        q = kael.transpose(kael.select(qkv, 2, 0), 1, 2)  # [B, H, T, D]
        if step is None:
            k = kael.transpose(kael.select(qkv, 2, 1), 1, 2)
            v = kael.transpose(kael.select(qkv, 2, 2), 1, 2)
            y = kael.attention(q, k, v, causal=True)
        else:  # the cache step stores this layer's new keys and values [B, 2, H, T, D]
            y = step.attend(layer, q, kael.permute(kael.narrow(qkv, 2, 1, 2), 0, 2, 3, 1, 4))
        x = kael.add(x, self.out(kael.reshape(kael.transpose(y, 1, 2), b, t, c)))
        return kael.add(x, kael.tanh(self.ff(x)))


class ToyLM(CausalLMBase):
    def __init__(self, config: ToyConfig) -> None:
        super().__init__()
        self.config = config
        self.vocab_size = config.vocab_size
        self.max_positions = config.max_position_embeddings
        c = config.hidden_size
        self.embed_tokens = nn.Embedding(config.vocab_size, c)
        self.embed_positions = nn.Embedding(config.max_position_embeddings, c)
        self.layers = nn.ModuleList([ToyLayer(c, config.num_heads) for _ in range(config.num_layers)])
        self.norm = nn.LayerNorm(c)
        self.lm_head = nn.Linear(c, config.vocab_size, bias=False)

    @property
    def num_layers(self) -> int:
        return self.config.num_layers

    @property
    def num_kv_heads(self) -> int:
        return self.config.num_heads

    @property
    def head_dim(self) -> int:
        return self.config.hidden_size // self.config.num_heads

    def embed(self, ids: kael.Tensor, starts: Sequence[int]) -> kael.Tensor:
        t = ids.shape[1]
        where = kael.tensor([list(range(s, s + t)) for s in starts], dtype=kael.int64, device=ids.device)
        return kael.add(self.embed_tokens(ids), self.embed_positions(where))

    def run_layer(self, i: int, x: kael.Tensor, step: Any) -> kael.Tensor:
        out: kael.Tensor = self.layers[i](x, step, i)
        return out

    def run_head(self, x: kael.Tensor) -> kael.Tensor:
        out: kael.Tensor = self.lm_head(self.norm(x))
        return out


def load(directory: Any, device: Any = "cpu", *, mmap: bool = False, dtype: Any = None) -> ToyLM:
    d = Path(directory)
    raw, _ = read_config_json(d, "kael-toy config")
    fields = {k: raw[k] for k in ToyConfig.__dataclass_fields__}
    model = ToyLM(ToyConfig(**fields))
    model.load_state_dict(kael.load_safetensors(d / "model.safetensors"))
    return model.eval()


def save(model: ToyLM, directory: Any) -> None:
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps({"model_type": "kael_toy", **asdict(model.config)}))
    kael.save_safetensors({k: kael.detach(v) for k, v in model.state_dict().items()}, d / "model.safetensors")
