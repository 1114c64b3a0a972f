"""kael.nn.functional: the stateless layer functions, with PyTorch's names and signatures.

They are thin wrappers over ``kael.ops`` (fused ops where one exists, so a backend's
kernel runs when it has one), adding PyTorch's argument conventions. One module per
concept: ``_basic`` (linear, norms, dropout, embedding, attention), ``_activation``,
``_loss``.
"""

from __future__ import annotations

from ._activation import (
    elu,
    gelu,
    hardsigmoid,
    hardswish,
    hardtanh,
    leaky_relu,
    log_softmax,
    logsigmoid,
    mish,
    prelu,
    relu,
    relu6,
    sigmoid,
    silu,
    softmax,
    softplus,
    softsign,
    tanh,
)
from ._basic import (
    dropout,
    embedding,
    layer_norm,
    linear,
    rms_norm,
    rope,
    scaled_dot_product_attention,
    silu_mul,
)
from ._loss import (
    binary_cross_entropy,
    binary_cross_entropy_with_logits,
    cosine_embedding_loss,
    cross_entropy,
    huber_loss,
    kl_div,
    l1_loss,
    mse_loss,
    nll_loss,
    smooth_l1_loss,
)

__all__ = [
    "linear",
    "layer_norm",
    "rms_norm",
    "rope",
    "silu_mul",
    "dropout",
    "embedding",
    "scaled_dot_product_attention",
    "relu",
    "relu6",
    "gelu",
    "silu",
    "tanh",
    "sigmoid",
    "softmax",
    "log_softmax",
    "leaky_relu",
    "elu",
    "softplus",
    "mish",
    "hardswish",
    "hardsigmoid",
    "hardtanh",
    "softsign",
    "logsigmoid",
    "prelu",
    "cross_entropy",
    "nll_loss",
    "mse_loss",
    "l1_loss",
    "smooth_l1_loss",
    "huber_loss",
    "binary_cross_entropy",
    "binary_cross_entropy_with_logits",
    "kl_div",
    "cosine_embedding_loss",
]
