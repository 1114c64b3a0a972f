"""The op catalogue's entries for convolution, pooling and batch normalisation (fused ops).

Kept beside ``_ops`` (which turns each ``(name, kind, args, doc)`` entry into an ``OpDef``
exactly as its own entries) so that module stays small. Each op here has a decomposition
and a NumPy host kernel; the frontend's functions are in ``kael/ops/_conv_fused.py``,
``_pool_fused.py``, ``_avg_pool_fused.py`` and ``_batch_norm_fused.py``.
"""

from __future__ import annotations

__all__ = ["NN_OPS"]

_PAIR = "tuple[int, int]"
_WINDOW = f"stride: {_PAIR}, padding: {_PAIR}, dilation: {_PAIR}"

#: (name, kind, kernel signature, doc) per op.
NN_OPS: list[tuple[str, str, str, str]] = [
    (
        "conv2d",
        "fused",
        f"out!, x, weight, bias?, {_WINDOW}, groups: int",
        "cross-correlation, torch.nn.functional.conv2d's: x [N,C,H,W], weight [O,C/groups,KH,KW], bias [O], out "
        "[N,O,OH,OW] with OH = (H + 2*padding[0] - dilation[0]*(KH-1) - 1) // stride[0] + 1 (zero padding on both "
        "sides); input channel block g feeds output channel block g (groups); 16-bit floats computed in float32",
    ),
    (
        "conv2d_backward",
        "fused",
        f"dx!?, dweight!?, dbias!?, grad, x, weight, {_WINDOW}, groups: int",
        "the gradients of conv2d for grad [N,O,OH,OW]: dx [N,C,H,W], dweight [O,C/groups,KH,KW], dbias [O] "
        "(the sum of grad over dims 0, 2, 3); each None when not wanted",
    ),
    (
        "max_pool2d",
        "fused",
        f"out!, indices!, x, kernel: {_PAIR}, {_WINDOW}, ceil_mode: bool",
        "x [N,C,H,W]; out, indices int64 [N,C,OH,OW] (sized by the frontend, PyTorch's rules): each window's first "
        "maximum (or first NaN) and its flat index h*W + w in the plane; positions outside x count as -inf",
    ),
    (
        "max_pool2d_backward",
        "fused",
        f"dx!, grad, indices, size: {_PAIR}, kernel: {_PAIR}, {_WINDOW}",
        "dx [N,C,*size] = 0 + grad [N,C,OH,OW] added at max_pool2d's indices (-1 skipped); the forward's window",
    ),
    (
        "avg_pool2d",
        "fused",
        f"out!, x, divisors, kernel: {_PAIR}, stride: {_PAIR}, padding: {_PAIR}",
        "x [N,C,H,W]; out [N,C,OH,OW] (sized by the frontend) = the sum of each window's positions inside x "
        "(zero padding) / divisors[oy, ox] (float64 [OH,OW], from PyTorch's count_include_pad and "
        "divisor_override rules)",
    ),
    (
        "avg_pool2d_backward",
        "fused",
        f"dx!, grad, divisors, size: {_PAIR}, kernel: {_PAIR}, stride: {_PAIR}, padding: {_PAIR}",
        "dx [N,C,*size]: each element the sum of grad / divisors over the windows that contain it",
    ),
    (
        "batch_norm",
        "fused",
        "out!, mean!, rstd!, x, weight?, bias?, eps: float",
        "training-mode batch norm of x [N,C,*S]: mean, rstd [C] float32 (float64 for float64 x) over every dim "
        "but 1, rstd = 1/sqrt(biased variance + eps); out = (x - mean) * rstd * weight + bias",
    ),
    (
        "batch_norm_eval",
        "fused",
        "out!, x, mean, var, weight?, bias?, eps: float",
        "eval-mode batch norm of x [N,C,*S] with given statistics mean, var [C] (any float dtype, e.g. the running "
        "ones): out = (x - mean) / sqrt(var + eps) * weight + bias, computed in float32 (float64 for float64 x)",
    ),
    (
        "batch_norm_backward",
        "fused",
        "dx!?, dweight!?, dbias!?, grad, x, mean, rstd, weight?",
        "batch_norm's gradients (batch statistics): with xhat = (x - mean) * rstd, M = x.numel() / C: dx = rstd * "
        "weight * (grad - sum(grad)/M - xhat * sum(grad * xhat)/M), dweight = sum(grad * xhat), dbias = sum(grad), "
        "sums per channel; each None when not wanted",
    ),
]
