"""gradcheck: autograd's Jacobians against central finite differences (float64 recommended).

For every floating-point output and every input that requires grad, the analytical
Jacobian (one backward per output element, ``kael.autograd.grad``) is compared with
the numerical one ``(f(x + eps e_k) - f(x - eps e_k)) / 2 eps``. Numerical
evaluations call ``fn`` on perturbed copies of the inputs (same dtype and device), so
``fn`` must be a function of its arguments only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

__all__ = ["gradcheck", "jacobians"]


def _outputs(r: Any) -> list[Any]:
    from kael import Tensor

    outs = list(r) if isinstance(r, (tuple, list)) else [r]
    return [o for o in outs if isinstance(o, Tensor) and o.dtype.is_floating_point]


def _host64(t: Any) -> np.ndarray:
    return np.asarray(t.detach(), dtype=np.float64)


def _replace(inputs: Sequence[Any], i: int, host: np.ndarray) -> list[Any]:
    import kael

    x = inputs[i]
    new = list(inputs)
    new[i] = kael.tensor(host, dtype=x.dtype, device=x.device)
    return new


def _flat_outputs(fn: Callable[..., Any], args: Sequence[Any]) -> np.ndarray:
    from kael.autograd import no_grad

    with no_grad():
        outs = _outputs(fn(*args))
    return np.concatenate([_host64(o).ravel() for o in outs]) if outs else np.zeros(0)


def jacobians(
    fn: Callable[..., Any], inputs: Sequence[Any], eps: float = 1e-6
) -> list[tuple[int, np.ndarray, np.ndarray]]:
    """[(input position, analytical J, numerical J)] for each input requiring grad.

    J has shape [total output elements, input elements] (outputs flattened and concatenated).
    """
    import kael
    from kael import Tensor
    from kael.autograd import grad

    inputs = list(inputs)
    wrt = [i for i, x in enumerate(inputs) if isinstance(x, Tensor) and x.requires_grad]
    if not wrt:
        raise AssertionError("gradcheck: no input requires grad; pass tensors made with requires_grad=True")
    for i in wrt:
        if not inputs[i].dtype.is_floating_point:
            raise AssertionError(f"gradcheck: input {i} has dtype {inputs[i].dtype!r}; expected floating point")
    outs = _outputs(fn(*inputs))
    if not outs:
        raise AssertionError("gradcheck: fn returned no floating-point tensor output")
    sizes = [o.numel() for o in outs]
    n_out = sum(sizes)
    result = []
    analytical = {i: np.zeros((n_out, inputs[i].numel())) for i in wrt}
    row = 0
    for o, size in zip(outs, sizes):
        if not o.requires_grad:  # an output that does not depend on any input: zero rows
            row += size
            continue
        for k in range(size):
            onehot = np.zeros(size)
            onehot[k] = 1.0
            g_out = kael.tensor(onehot.reshape(o.shape), dtype=o.dtype, device=o.device)
            gs = grad(o, [inputs[i] for i in wrt], grad_outputs=g_out, retain_graph=True, allow_unused=True)
            for i, g in zip(wrt, gs):
                if g is None:
                    continue
                if tuple(g.shape) != tuple(inputs[i].shape):
                    raise AssertionError(
                        f"gradcheck: gradient for input {i} has shape {list(g.shape)}, expected {list(inputs[i].shape)}"
                    )
                if g.dtype is not inputs[i].dtype:
                    raise AssertionError(
                        f"gradcheck: gradient for input {i} has dtype {g.dtype!r}, expected {inputs[i].dtype!r}"
                    )
                analytical[i][row + k] = _host64(g).ravel()
        row += size
    for i in wrt:
        base = _host64(inputs[i])
        numerical = np.zeros((n_out, base.size))
        for k in range(base.size):
            plus, minus = base.copy(), base.copy()
            plus.flat[k] += eps
            minus.flat[k] -= eps
            fp = _flat_outputs(fn, _replace(inputs, i, plus))
            fm = _flat_outputs(fn, _replace(inputs, i, minus))
            numerical[:, k] = (fp - fm) / (2 * eps)
        result.append((i, analytical[i], numerical))
    return result


def gradcheck(
    fn: Callable[..., Any],
    inputs: Sequence[Any] | Any,
    *,
    eps: float = 1e-6,
    atol: float = 1e-5,
    rtol: float = 1e-3,
    name: str = "",
) -> bool:
    """Check fn's gradients with respect to every input that requires grad; True or AssertionError.

    ``inputs`` is a tensor or a sequence of positional arguments (tensors and other values).
    Use float64 inputs: the default tolerances assume them.
    """
    from kael import Tensor

    args = [inputs] if isinstance(inputs, Tensor) else list(inputs)
    label = f"gradcheck{f' ({name})' if name else ''}"
    for i, analytical, numerical in jacobians(fn, args, eps):
        with np.errstate(invalid="ignore"):
            bad = ~(np.abs(analytical - numerical) <= atol + rtol * np.abs(numerical))
        if bad.any():
            diff = np.where(bad, np.abs(analytical - numerical), -1.0)
            r, c = np.unravel_index(int(np.nanargmax(np.nan_to_num(diff, nan=np.inf))), diff.shape)
            raise AssertionError(
                f"{label}: Jacobian mismatch for input {i} (shape {list(args[i].shape)}): {int(bad.sum())} of "
                f"{bad.size} entries differ; worst at output element {r}, input element {c}: analytical "
                f"{analytical[r, c]:.8g}, numerical {numerical[r, c]:.8g} (atol={atol:g}, rtol={rtol:g})\n"
                f"analytical:\n{np.array2string(analytical, precision=5)}\n"
                f"numerical:\n{np.array2string(numerical, precision=5)}"
            )
    return True
