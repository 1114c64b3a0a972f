"""Checkpoint directories: one ``model.safetensors`` or Hugging Face's sharded layout.

A sharded checkpoint is ``model.safetensors.index.json``::

    {"metadata": {"total_size": 123456}, "weight_map": {"model.norm.weight": "model-00002-of-00002.safetensors", ...}}

plus the shards it names. NOTE [checkpoint validation]: every header (the index and each
shard's safetensors header) is read and checked before any tensor data is read or
allocated: shard names are plain file names inside the directory, every shard exists,
each tensor the index maps to a shard is in that shard and nowhere else, a shard holds no
tensor the index does not name, and (when the caller says what it expects) no tensor is
missing or unexpected, every shape matches and every expected weight is floating point.
Each violation is a ``kael.FormatError`` naming the file and the rule.

``save_checkpoint_tensors`` writes the same layouts (one file up to ``max_shard_size``,
shards and an index beyond it), each file atomically and the index last, so a reader never
sees an index naming shards that are not complete.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kael._device import DeviceLike, as_device
from kael._errors import FormatError

from ._atomic import atomic_write
from ._safetensors_format import DTYPES, KAEL_TO_ST, build_header, fail
from ._safetensors_load import _open_header, load_arrays
from ._safetensors_save import save_entries

if TYPE_CHECKING:
    from kael._dtype import DType
    from kael._tensor import Tensor

__all__ = [
    "INDEX_NAME",
    "SINGLE_NAME",
    "DEFAULT_MAX_SHARD_SIZE",
    "CheckpointEntry",
    "load_checkpoint_tensors",
    "parse_size",
    "read_checkpoint_entries",
    "save_checkpoint_tensors",
]

SINGLE_NAME = "model.safetensors"
INDEX_NAME = "model.safetensors.index.json"
DEFAULT_MAX_SHARD_SIZE = "5GB"
MAX_INDEX_BYTES = 100_000_000
MAX_NAME_BYTES = 255  # NAME_MAX on Linux, macOS and Windows file systems
# The dtypes a floating-point weight may be stored in (float64 too: kael saves float64 models).
_FLOAT_ST = ("F32", "F16", "BF16", "F64")
_SHARD_NAME = re.compile(r"model-\d{5}-of-\d{5}\.safetensors")
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B|B)?\s*", re.IGNORECASE)
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}
_UNITS.update({"KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40})


@dataclass(frozen=True)
class CheckpointEntry:
    """One tensor of a checkpoint as its header describes it: kael dtype name, shape, file name."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    file: str


def _plain_name(name: object, where: str, what: str) -> str:
    """A shard name must be a plain file name: no directory part, no '..', no NUL, at most 255 UTF-8 bytes."""
    if not isinstance(name, str):
        fail(where, "shard name", f"the {what} must be a string, got {type(name).__name__}")
    try:
        size = len(name.encode("utf-8"))
    except UnicodeEncodeError:
        fail(where, "shard name", f"the {what} {name!r} is not valid Unicode (it holds a lone surrogate)")
    if size > MAX_NAME_BYTES:
        fail(where, "shard name", f"the {what} is {size} bytes long; a file name holds at most {MAX_NAME_BYTES}")
    if (
        not name
        or name in (".", "..")
        or "/" in name
        or "\\" in name
        or "\0" in name
        or os.path.basename(name) != name
        or Path(name).is_absolute()
    ):
        fail(where, "shard name", f"the {what} {name!r} must be a plain file name inside the checkpoint directory")
    return name


def _read_index(path: Path) -> dict[str, str]:
    """The validated weight map of an index file: tensor name -> shard file name."""
    where = f"checkpoint index {os.fspath(path)!r}"
    try:
        size = path.stat().st_size
        if size > MAX_INDEX_BYTES:
            fail(where, "index too large", f"{size} bytes exceeds the limit of {MAX_INDEX_BYTES}")
        raw = path.read_bytes()
    except OSError as e:
        fail(where, "unreadable", str(e))

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in items:
            if key in out:
                fail(where, "duplicate key", f"the key {key!r} appears more than once in a JSON object")
            out[key] = value
        return out

    try:
        obj = json.loads(raw.decode("utf-8"), object_pairs_hook=pairs)
    except UnicodeDecodeError as e:
        fail(where, "index UTF-8", f"the index is not valid UTF-8 ({e.reason} at byte {e.start})")
    except FormatError:
        raise
    except RecursionError:
        fail(where, "index JSON", "the index is nested too deeply")
    except ValueError as e:  # json.JSONDecodeError, over-long integer literals
        fail(where, "index JSON", f"the index is not valid JSON ({e})")
    if not isinstance(obj, dict):
        fail(where, "index JSON", f"the index must be a JSON object, got {type(obj).__name__}")
    weight_map = obj.get("weight_map")
    if not isinstance(weight_map, dict):
        got = "nothing" if weight_map is None else type(weight_map).__name__
        fail(where, "weight_map", f"expected an object mapping tensor names to shard files, got {got}")
    if not weight_map:
        fail(where, "weight_map", "the weight map names no tensors")
    metadata = obj.get("metadata", {})
    if metadata is not None and not isinstance(metadata, dict):
        fail(where, "metadata", f"expected an object, got {type(metadata).__name__}")
    for name, file in weight_map.items():
        _plain_name(file, where, f"shard of tensor {name!r}")
    return dict(weight_map)


def read_checkpoint_entries(directory: str | os.PathLike[str]) -> dict[str, CheckpointEntry]:
    """Every tensor of a checkpoint directory as its headers describe it, without reading data.

    Reads ``model.safetensors`` when present, otherwise ``model.safetensors.index.json``
    and the shards it names, and checks the rules of NOTE [checkpoint validation] that
    need no expectations. Raises ``kael.FormatError`` naming the file and the rule.
    """
    d = Path(directory)
    where = f"checkpoint directory {os.fspath(d)!r}"
    if not d.is_dir():
        fail(where, "not a directory", "expected a directory holding model.safetensors or its index")
    single, index = d / SINGLE_NAME, d / INDEX_NAME
    if single.is_file() or not index.exists():
        if not single.is_file():
            fail(where, "no weights", f"neither {SINGLE_NAME} nor {INDEX_NAME} is there")
        return {e.name: e for e in _shard_entries(d, SINGLE_NAME)}
    weight_map = _read_index(index)
    iwhere = f"checkpoint index {os.fspath(index)!r}"
    shards = sorted(set(weight_map.values()))
    for shard in shards:
        try:
            present = (d / shard).is_file()
        except (OSError, ValueError) as err:
            fail(iwhere, "missing shard", f"the shard {shard!r} it names cannot be looked up ({err})")
        if not present:
            fail(iwhere, "missing shard", f"the shard {shard!r} it names does not exist")
    out: dict[str, CheckpointEntry] = {}
    for shard in shards:
        swhere = f"safetensors file {os.fspath(d / shard)!r}"
        for e in _shard_entries(d, shard):
            if e.name not in weight_map:
                fail(swhere, "not in index", f"the shard holds a tensor {INDEX_NAME} does not name", e.name)
            if e.name in out:
                fail(swhere, "duplicate tensor", f"the tensor is also in {out[e.name].file!r}", e.name)
            if weight_map[e.name] != shard:
                fail(swhere, "wrong shard", f"the index maps the tensor to {weight_map[e.name]!r}", e.name)
            out[e.name] = e
    for name, shard in weight_map.items():
        if name not in out:
            fail(f"safetensors file {os.fspath(d / shard)!r}", "missing tensor", f"{INDEX_NAME} maps it here", name)
    return out


def _shard_entries(d: Path, shard: str) -> list[CheckpointEntry]:
    path = d / shard
    where = f"safetensors file {os.fspath(path)!r}"
    try:
        with open(path, "rb") as f:
            header, _ = _open_header(f, where)
    except OSError as e:
        fail(where, "unreadable", str(e))
    return [CheckpointEntry(e.name, DTYPES[e.dtype].kael, e.shape, shard) for e in header.entries]


def _check_expected(
    entries: Mapping[str, CheckpointEntry],
    expected: Mapping[str, tuple[int, ...]],
    optional: frozenset[str],
    where: str,
) -> None:
    missing = sorted(n for n in expected if n not in entries and n not in optional)
    unexpected = sorted(n for n in entries if n not in expected and n not in optional)
    problems = []
    if missing:
        problems.append(f"missing tensor(s) {missing}")
    if unexpected:
        problems.append(f"unexpected tensor(s) {unexpected}")
    for name, want in expected.items():
        e = entries.get(name)
        if e is None:
            continue
        if tuple(e.shape) != tuple(want):
            problems.append(f"{name!r} in {e.file!r} has shape {list(e.shape)}, expected {list(want)}")
        elif KAEL_TO_ST[e.dtype] not in _FLOAT_ST:
            problems.append(
                f"{name!r} in {e.file!r} has dtype {e.dtype}, expected float32, float16, bfloat16 or float64"
            )
    if problems:
        fail(where, "checkpoint contents", "; ".join(problems))


def load_checkpoint_tensors(
    directory: str | os.PathLike[str],
    *,
    device: DeviceLike = "cpu",
    dtype: DType | str | None = None,
    mmap: bool = False,
    expected: Mapping[str, tuple[int, ...]] | None = None,
    optional: Iterable[str] = (),
    ignore: Iterable[str] = (),
) -> dict[str, Tensor]:
    """Load a checkpoint directory (``model.safetensors`` or the sharded layout) as ``{name: Tensor}``.

    All headers are validated first (NOTE [checkpoint validation]); with ``expected``
    (name -> shape), a missing name (unless in ``optional``), an unexpected one (unless
    in ``optional``), a shape mismatch or a non-floating expected weight is a
    ``kael.FormatError`` raised before any tensor data is read. ``dtype=None`` keeps each
    tensor's stored dtype; a floating-point kael dtype converts every floating tensor to it
    (integer and bool tensors stay as stored). ``mmap=True`` maps each shard (NOTE [mapped
    loads]). ``ignore``: name prefixes of tensors that belong to another model in the same
    files (a multimodal checkpoint's vision tower): their headers are validated, their data
    is neither checked against ``expected``, read nor returned.
    """
    from kael._dtype import as_dtype
    from kael._errors import DTypeError

    dev = as_device(device)  # bad arguments fail before any file is read
    target = None
    if dtype is not None:
        target = as_dtype(dtype)
        if not target.is_floating_point:
            raise DTypeError(f"load_checkpoint_tensors: dtype must be a floating-point dtype, got {target.name!r}")
    d = Path(directory)
    skipped = tuple(ignore)
    entries = {n: e for n, e in read_checkpoint_entries(d).items() if not n.startswith(skipped)}
    if expected is not None:
        _check_expected(entries, expected, frozenset(optional), f"checkpoint directory {os.fspath(d)!r}")
    by_file: dict[str, list[str]] = {}
    for e in entries.values():
        by_file.setdefault(e.file, []).append(e.name)
    out: dict[str, Tensor] = {}
    for shard, names in by_file.items():
        arrays, _ = load_arrays(d / shard, mmap=mmap, names=set(names) if skipped else None)
        if set(arrays) != set(names):
            fail(f"safetensors file {os.fspath(d / shard)!r}", "changed", "the file changed while it was loaded")
        for name in names:
            arr, kind = arrays[name]
            out[name] = _tensor(arr, kind, dev, target)
    return {name: out[name] for name in entries}


def _tensor(arr: Any, kind: str, dev: Any, target: DType | None) -> Tensor:
    from kael._dtype import BY_NAME
    from kael._tensor import from_numpy_bits
    from kael.ops import to

    t = from_numpy_bits(arr, BY_NAME[kind])
    if target is not None and t.dtype.is_floating_point and t.dtype is not target:
        t = to(t, dtype=target)
    return t if dev.type == "cpu" else to(t, device=dev)


def parse_size(size: int | str, where: str = "save_checkpoint_tensors") -> int:
    """A byte count from an int or Hugging Face's size strings (``"50KB"`` = 50,000; ``"2GiB"`` = 2**31)."""
    if isinstance(size, bool) or not isinstance(size, (int, str)):
        fail(where, "max_shard_size", f"expected a positive int or a size string like '5GB', got {size!r}")
    if isinstance(size, int):
        n = size
    else:
        m = _SIZE.fullmatch(size)
        if m is None:
            fail(where, "max_shard_size", f"cannot read {size!r} as a size; expected e.g. '5GB', '50KB', '2GiB'")
        n = math.floor(float(m.group(1)) * _UNITS[(m.group(2) or "").upper()])
    if n < 1:
        fail(where, "max_shard_size", f"must be at least 1 byte, got {size!r}")
    return n


def save_checkpoint_tensors(
    directory: str | os.PathLike[str],
    tensors: Mapping[str, Tensor],
    *,
    max_shard_size: int | str = DEFAULT_MAX_SHARD_SIZE,
    metadata: Mapping[str, str] | None = None,
) -> list[str]:
    """Write ``tensors`` as a checkpoint directory that transformers (and kael) load; return the files.

    Up to ``max_shard_size`` bytes of tensor data go to ``model.safetensors``; beyond it,
    tensors are split in order into ``model-0000i-of-0000n.safetensors`` shards (a tensor
    larger than the limit gets a shard of its own) and ``model.safetensors.index.json``
    maps each name to its shard, with ``metadata.total_size``. Each shard's safetensors
    metadata is ``metadata`` (default ``{"format": "pt"}``, which transformers expects).
    Everything is validated before the first file is written; each file is written
    atomically, the index last, and weights of the other layout left from an earlier save
    are removed so the directory holds one checkpoint.
    """
    from kael._tensor import Tensor, numpy_bits

    d = Path(directory)
    where = f"save_checkpoint_tensors to {os.fspath(d)!r}"
    limit = parse_size(max_shard_size, where)
    if not isinstance(tensors, Mapping):
        fail(where, "value", f"expected a dict of tensors, got {type(tensors).__name__}")
    if not tensors:
        fail(where, "value", "there are no tensors to save")
    meta = {"format": "pt"} if metadata is None else metadata
    shards: list[list[tuple[str, Tensor, int]]] = [[]]
    size = 0
    for name, t in tensors.items():
        if not isinstance(t, Tensor):
            fail(where, "value", f"expected a kael Tensor, got {type(t).__name__}", str(name))
        nbytes = t.nbytes
        if shards[-1] and size + nbytes > limit:
            shards.append([])
            size = 0
        shards[-1].append((name, t, nbytes))
        size += nbytes
    names = (
        [SINGLE_NAME]
        if len(shards) == 1
        else [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    )
    plans = []
    for file, shard in zip(names, shards, strict=True):
        # Wider dtypes first keeps every tensor aligned for mapped loads (NOTE [mapped loads]).
        ordered = sorted(shard, key=lambda x: -x[1].dtype.itemsize)
        entries = [(n, t.dtype.name, tuple(t.shape), lambda t=t: numpy_bits(t)) for n, t, _ in ordered]
        build_header([(n, k, s) for n, k, s, _ in entries], meta, f"{where} ({file})")  # validate all first
        plans.append((file, entries))
    d.mkdir(parents=True, exist_ok=True)
    old_shards = _listed_shards(d)
    for file, entries in plans:
        save_entries(entries, d / file, meta, f"{where} ({file})")
    if len(shards) == 1:
        _remove(d / INDEX_NAME)
    else:
        weight_map = {n: file for file, shard in zip(names, shards, strict=True) for n, _, _ in shard}
        index = {
            "metadata": {"total_size": sum(nbytes for shard in shards for _, _, nbytes in shard)},
            "weight_map": dict(sorted(weight_map.items())),
        }
        with atomic_write(d / INDEX_NAME) as f:
            f.write((json.dumps(index, indent=2) + "\n").encode("utf-8"))
        _remove(d / SINGLE_NAME)
    for stale in old_shards - set(names):
        _remove(d / stale)
    return names + ([] if len(shards) == 1 else [INDEX_NAME])


def _listed_shards(d: Path) -> set[str]:
    """Shard files of an earlier sharded save (named the way this writer and transformers name them)."""
    return {p.name for p in d.iterdir() if _SHARD_NAME.fullmatch(p.name) and p.is_file()}


def _remove(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass
