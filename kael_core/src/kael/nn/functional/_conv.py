"""The convolution functions of kael.nn.functional: conv1d, conv2d, conv_transpose2d and pad.

They are ``kael.ops._conv``'s (an im2col gather plus a matmul, NOTE [convolution by
gather and matmul]), with PyTorch's signatures and defaults.
"""

from __future__ import annotations

from ...ops._conv import conv1d, conv2d, conv_transpose2d, pad

__all__ = ["conv1d", "conv2d", "conv_transpose2d", "pad"]
