"""The Tensor: a strided view over a Storage, with autograd state.

The frontend owns all metadata (shape, strides in elements, storage offset,
dtype, device); backends only see Tensors handed to kernels. Operators and most
methods are attached by ``kael.ops`` (see ``ops/_methods.py``) to keep this file
about the data structure itself.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from . import _dtype as dt
from ._device import CPU, Device
from ._errors import DTypeError, ShapeError
from ._storage import Storage
from ._strides import contiguous_strides, numel_of

if TYPE_CHECKING:
    from .autograd._function import Node

__all__ = ["Tensor", "contiguous_strides", "empty_strided", "from_numpy", "from_numpy_bits", "numpy_bits"]


class Tensor:
    """An n-dimensional array on a device: a strided view over a ``Storage``, with autograd state.

    Create tensors with ``kael.tensor``, ``kael.zeros``, ``kael.from_numpy`` and the other factory
    functions (calling ``Tensor()`` raises ``TypeError``). ``shape`` is a tuple of ints, ``dtype`` a
    ``kael.DType``, ``device`` a ``kael.Device``; ``requires_grad``, ``grad`` and ``grad_fn`` are the
    autograd state (``grad_fn`` is None for a leaf). Views (``view``, ``permute``, ``T``, indexing, ...)
    share the storage of the tensor they view; operators and most methods are the ``kael.*`` functions
    of the same name, attached by ``kael.ops``.
    """

    __slots__ = (
        "__weakref__",
        "_accumulator",
        "_base",
        "_hooks",
        "_npv",
        "_offset",
        "_output_nr",
        "_post_acc_hooks",
        "_retains_grad",
        "_storage",
        "_strides",
        "_view_fn",
        "device",
        "dtype",
        "grad",
        "grad_fn",
        "requires_grad",
        "shape",
    )

    _storage: Storage
    shape: tuple[int, ...]
    _strides: tuple[int, ...]
    _offset: int
    dtype: dt.DType
    device: Device
    requires_grad: bool
    grad: Tensor | None
    grad_fn: Node | None
    _output_nr: int
    _base: Tensor | None
    _hooks: list[Any] | None
    _retains_grad: bool
    _npv: np.ndarray | None
    _accumulator: Any  # a weak reference to the leaf's AccumulateGrad, or None (NOTE [accumulator cycle])
    _post_acc_hooks: list[Any] | None
    _view_fn: Any

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("create tensors with kael.tensor(), kael.zeros(), kael.from_numpy(), ...")

    @classmethod
    def _make(
        cls,
        storage: Storage,
        shape: tuple[int, ...],
        strides: tuple[int, ...],
        offset: int,
        dtype: dt.DType,
        base: Tensor | None = None,
    ) -> Tensor:
        t = object.__new__(cls)
        t._storage = storage
        t.shape = shape
        t._strides = strides
        t._offset = offset
        t.dtype = dtype
        t.device = storage.device
        t.requires_grad = False
        t.grad = None
        t.grad_fn = None
        t._output_nr = 0
        t._base = base
        t._hooks = None
        t._retains_grad = False
        t._npv = None
        t._accumulator = None
        t._post_acc_hooks = None
        t._view_fn = None
        return t

    if TYPE_CHECKING:
        # Most methods (reshape, backward, add_, ...) are attached by kael.ops._methods at import time.
        def __getattr__(self, name: str) -> Any: ...

        # Operators too; mypy does not look operators up through __getattr__.
        def __add__(self, other: Any) -> Tensor: ...
        def __getitem__(self, key: Any) -> Tensor: ...
        def __setitem__(self, key: Any, value: Any) -> None: ...
        def __neg__(self) -> Tensor: ...
        def __eq__(self, other: Any) -> Tensor: ...  # type: ignore[override]

        __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = __rtruediv__ = __add__
        __pow__ = __rpow__ = __floordiv__ = __mod__ = __matmul__ = __rmatmul__ = __and__ = __or__ = __add__
        __iadd__ = __isub__ = __imul__ = __itruediv__ = __lt__ = __le__ = __gt__ = __ge__ = __add__
        __ne__ = __eq__  # type: ignore[assignment]
        __pos__ = __abs__ = __invert__ = __neg__

    def _alias(self) -> Tensor:
        """A new Tensor object over the same elements, without autograd state."""
        t = Tensor._make(self._storage, self.shape, self._strides, self._offset, self.dtype, self._base)
        t._view_fn = self._view_fn
        return t

    # -- metadata ------------------------------------------------------------------
    @property
    def ndim(self) -> int:
        """The number of dims, ``len(self.shape)`` (0 for a scalar tensor)."""
        return len(self.shape)

    def dim(self) -> int:
        """The number of dims, ``len(self.shape)``; the same as ``ndim``."""
        return len(self.shape)

    def size(self, dim: int | None = None) -> Any:
        """The shape as a tuple of ints, or with ``dim`` the size of that dim (negative counts from the end).

        A ``dim`` out of range raises ``kael.IndexError_``, one that is not an int ``DTypeError``.
        """
        if dim is None:
            return self.shape
        return self.shape[self._wrap_dim(dim, "size")]

    def stride(self, dim: int | None = None) -> Any:
        """The strides in elements (not bytes) as a tuple, or with ``dim`` the stride of that dim.

        A ``dim`` out of range raises ``kael.IndexError_``, one that is not an int ``DTypeError``.
        """
        if dim is None:
            return self._strides
        return self._strides[self._wrap_dim(dim, "stride")]

    def storage_offset(self) -> int:
        """The index, in elements, of this tensor's first element in its storage (nonzero for many views)."""
        return self._offset

    def untyped_storage(self) -> Storage:
        """The Storage this tensor views (shared with every view of it): data, nbytes, device, version."""
        return self._storage

    def numel(self) -> int:
        """The number of elements, the product of ``shape`` (1 for a 0-d tensor)."""
        return numel_of(self.shape)

    def element_size(self) -> int:
        """The size of one element in bytes (``dtype.itemsize``)."""
        return self.dtype.itemsize

    @property
    def nbytes(self) -> int:
        """The bytes this tensor's elements take, ``numel() * element_size()`` (not its storage's size)."""
        return self.numel() * self.dtype.itemsize

    @property
    def is_leaf(self) -> bool:
        """Whether no recorded operation produced this tensor (``grad_fn`` is None): a leaf of the autograd graph."""
        return self.grad_fn is None

    def register_post_accumulate_grad_hook(self, hook: Any) -> Any:
        """Run ``hook(self)`` each time a backward has accumulated this leaf's gradient into ``.grad``
        (after any ``register_hook`` hooks; as PyTorch's method of this name). Returns a handle whose
        ``remove()`` unregisters it. Data-parallel training starts its gradient reductions here."""
        from ._errors import AutogradError

        if not self.requires_grad or self.grad_fn is not None:
            raise AutogradError(
                "register_post_accumulate_grad_hook: only a leaf tensor that requires grad accumulates a "
                f"gradient (this one has requires_grad={self.requires_grad}, grad_fn={self.grad_fn!r})"
            )
        if not callable(hook):
            raise AutogradError(f"register_post_accumulate_grad_hook: expected a callable, got {hook!r}")
        if self._post_acc_hooks is None:
            self._post_acc_hooks = []
        hooks: list[Any] = self._post_acc_hooks
        hooks.append(hook)

        class _Handle:
            def remove(self) -> None:
                if hook in hooks:
                    hooks.remove(hook)

        return _Handle()

    @property
    def is_cuda(self) -> bool:
        """Whether this tensor lives on a ``cuda`` device."""
        return self.device.type == "cuda"

    def is_floating_point(self) -> bool:
        """Whether the dtype is a floating-point one (float16, bfloat16, float32, float64)."""
        return self.dtype.is_floating_point

    def is_contiguous(self) -> bool:
        """Whether the elements lie in row-major order without gaps (the strides of size-1 dims do not count).

        Views such as ``T``, ``permute`` or a step slice usually are not; ``contiguous()`` makes a copy that is.
        """
        expected = 1
        for n, s in zip(reversed(self.shape), reversed(self._strides)):
            if n != 1 and s != expected:
                return False
            expected *= n
        return True

    def data_ptr(self) -> int:
        """The memory address of this tensor's first element: its storage's, plus ``storage_offset()`` elements."""
        return self._storage.data_ptr() + self._offset * self.dtype.itemsize

    def _np_writable(self) -> bool:
        d = self._storage.data
        flags = getattr(d, "flags", None)
        return True if flags is None else bool(flags.writeable)

    def _version(self) -> int:
        return self._storage.version

    def _bump_version(self) -> None:
        self._storage.version += 1

    def _wrap_dim(self, dim: int, op: str) -> int:
        n = len(self.shape)
        if not isinstance(dim, int) or isinstance(dim, bool):
            raise DTypeError(f"{op}: dim must be an int, got {dim!r}")
        lo, hi = (-1, 0) if n == 0 else (-n, n - 1)
        if dim < lo or dim > hi:
            from ._errors import IndexError_

            raise IndexError_(f"{op}: dim {dim} is out of range for a {n}-d tensor (expected {lo}..{hi})")
        return dim + n if dim < 0 else (0 if n == 0 else dim)

    # -- host access -----------------------------------------------------------------
    def _np_view(self) -> np.ndarray:
        """A NumPy view of a CPU tensor (bfloat16 shows its uint16 bits). Cached."""
        v = self._npv
        if v is None:
            isz = self.dtype.itemsize
            if 0 in self.shape:  # no element: the offset of an empty view may lie past its storage
                v = self._npv = np.empty(self.shape, self.dtype.np)
                return v
            v = np.ndarray(
                self.shape,
                self.dtype.np,
                buffer=self._storage.data,
                offset=self._offset * isz,
                strides=tuple(s * isz for s in self._strides),
            )
            self._npv = v
        return v

    def _host(self) -> np.ndarray:
        """The values on the host as a NumPy array, bfloat16 widened to float32."""
        if self.device.type == "cpu":
            a = self._np_view()
        else:
            from . import _dispatch

            a = _dispatch.backend_for(self.device.type).to_host(self)
        if self.dtype is dt.bfloat16:
            a = dt.bf16_bits_to_f32(a)
        return a

    def numpy(self, *, force: bool = False) -> np.ndarray:
        """A NumPy array sharing memory with this CPU tensor (a copy elsewhere, with force=True)."""
        if self.requires_grad and not force:
            from ._errors import AutogradError

            raise AutogradError("numpy(): tensor requires grad; call .detach().numpy()")
        if self.dtype is dt.bfloat16:
            raise DTypeError("numpy(): NumPy has no bfloat16; call .float().numpy() first")
        if self.device.type != "cpu":
            from ._errors import DeviceError

            if not force:
                raise DeviceError(f"numpy(): tensor is on {self.device}; call .cpu() first (or numpy(force=True))")
            return self._host()
        return self._np_view()

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        a = self._host()
        return a.astype(dtype) if dtype is not None else a

    def item(self) -> bool | int | float:
        """The value of a one-element tensor as a Python bool, int or float (copied to the host if needed).

        Raises ``ShapeError`` when the tensor does not hold exactly one element.
        """
        if self.numel() != 1:
            raise ShapeError(f"item(): expected a tensor with one element, got shape {list(self.shape)}")
        return self._host().reshape(()).item()  # type: ignore[no-any-return]

    def tolist(self) -> Any:
        """The values as nested Python lists (a Python scalar for a 0-d tensor), copied to the host."""
        return self._host().tolist()

    def __len__(self) -> int:
        if not self.shape:
            raise ShapeError("len() of a 0-d tensor")
        return self.shape[0]

    def __bool__(self) -> bool:
        if self.numel() != 1:
            raise ShapeError(
                f"the truth value of a tensor with {self.numel()} elements is ambiguous; use any() or all()"
            )
        return bool(self.item())

    def __int__(self) -> int:
        return int(self.item())

    def __float__(self) -> float:
        return float(self.item())

    def __index__(self) -> int:
        if self.dtype.category != 1 or self.numel() != 1:
            raise DTypeError(f"only one-element integer tensors can be used as an index, got {self.dtype!r}")
        return int(self.item())

    def __hash__(self) -> int:
        return id(self)

    def __iter__(self) -> Any:
        if not self.shape:
            raise ShapeError("iteration over a 0-d tensor")
        return (self[i] for i in range(self.shape[0]))

    # -- DLPack ------------------------------------------------------------------------
    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any:
        if self.requires_grad:
            from ._errors import AutogradError

            raise AutogradError("__dlpack__: tensor requires grad; call .detach() first")
        if self.device.type == "cpu":
            if self.dtype is dt.bfloat16:
                raise DTypeError("__dlpack__: bfloat16 export is not supported by NumPy's DLPack")
            return self._np_view().__dlpack__(*args, **kwargs)
        from . import _dispatch

        backend = _dispatch.backend_for(self.device.type)
        return backend.dlpack(self, *args, **kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        if self.device.type == "cpu":
            return (1, 0)
        return (2, self.device.index or 0)

    # -- repr ----------------------------------------------------------------------------
    def __repr__(self) -> str:
        from ._tensor_str import tensor_repr

        return tensor_repr(self)


def empty_strided(shape: tuple[int, ...], dtype: dt.DType, device: Device = CPU) -> Tensor:
    """A new contiguous tensor with uninitialised values."""
    from . import _dispatch

    nbytes = numel_of(shape) * dtype.itemsize
    if device is CPU:
        data = _cpu_alloc(nbytes, device)
    else:
        data = _dispatch.backend_for(device.type).allocate(nbytes, device)
    return Tensor._make(Storage(data, nbytes, device), shape, contiguous_strides(shape), 0, dtype)


def _cpu_alloc(nbytes: int, device: Device) -> Any:
    from . import _dispatch

    return _dispatch.backend_for("cpu").allocate(nbytes, device)


def from_numpy(arr: np.ndarray) -> Tensor:
    """A CPU tensor sharing memory with `arr` (any non-negative strides; copies otherwise)."""
    if not isinstance(arr, np.ndarray):
        raise DTypeError(f"from_numpy: expected a numpy.ndarray, got {type(arr).__name__}")
    dtype = dt.from_numpy_dtype(arr.dtype.newbyteorder("=") if arr.dtype.byteorder not in "=|" else arr.dtype)
    if arr.dtype.byteorder not in "=|" and arr.dtype.byteorder != ("<" if np.little_endian else ">"):
        arr = arr.astype(dtype.np)
    return from_numpy_bits(arr, dtype)


def from_numpy_bits(arr: np.ndarray, dtype: dt.DType) -> Tensor:
    """Wrap `arr` (whose itemsize is dtype's) as a tensor of `dtype` without copying."""
    isz = dtype.itemsize
    if arr.dtype.itemsize != isz:
        raise DTypeError(f"from_numpy_bits: array itemsize {arr.dtype.itemsize} != {dtype!r} itemsize {isz}")
    if any(s < 0 or s % isz for s in arr.strides):
        arr = np.ascontiguousarray(arr)
    shape = tuple(int(n) for n in arr.shape)
    strides = tuple(int(s) // isz for s in arr.strides)
    if arr.size == 0:
        flat = np.empty(0, np.uint8)
        strides = contiguous_strides(shape)
    else:
        extent = 1 + sum((n - 1) * s for n, s in zip(shape, strides))
        flat = np.lib.stride_tricks.as_strided(arr, shape=(extent,), strides=(isz,), writeable=arr.flags.writeable)
        flat = flat.view(np.uint8)
    t = Tensor._make(Storage(flat, flat.nbytes, CPU), shape, strides, 0, dtype)
    return t


def numpy_bits(t: Tensor) -> np.ndarray:
    """A C-contiguous host array of t's raw elements (uint16 bits for bfloat16)."""
    if t.device.type == "cpu":  # np.asarray(order="C"), not ascontiguousarray: that turns 0-d into 1-d
        return np.asarray(t._np_view(), order="C")
    from . import _dispatch

    return np.asarray(_dispatch.backend_for(t.device.type).to_host(t), order="C")
