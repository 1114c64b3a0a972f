"""The backend conformance kit: a table-driven pytest suite any kael backend can run.

Run it against an installed backend with::

    python -m pytest --pyargs kael.testing.conformance --kael-backend NAME

(the ``--kael-backend`` option comes from the ``kael_pytest`` pytest plugin,
registered under the ``pytest11`` entry point of kael-core; without the option every
test here is skipped). The suite checks:

* every primitive and every fused op the backend implements against the NumPy
  reference kernels, over the dtypes the frontend can hand it and samples that include
  0-d, empty, non-contiguous (transposed, strided with offsets, permuted), stride-0
  broadcast operands, strided and aliased outputs, special values and one large input
  (``test_kernels.py``, ``test_fused.py``);
* each fused op's frontend decomposition, run on the backend's primitives, against the
  reference kernel (``test_fused.py``);
* memory (allocate / from_host / to_host per dtype), random kernels, gradients in
  float64 (``kael.testing.gradcheck``), DLPack, frontend ops end to end and a tiny
  GPT-2 training step against the reference backend.

The table is public so a backend's own tests can reuse it: ``all_cases()`` lists
``Case`` rows (``case.id`` is ``op-dtype-sample``), ``check_kernel(case, backend,
device)`` runs one. Failure messages name the op, dtype, sample, output, the worst
element and the max abs diff. ``vals`` (sample values of a kind), ``host_bits`` (values
in a dtype's storage representation), ``host_values`` (a tensor's values on the host)
and ``KERNEL_TOL`` (tolerances per dtype) serve a backend's own tests and fuzzers.

The elementwise rows are made from the op catalogue (``kael.backends.catalogue``), so a
new elementwise op is covered as soon as it has a catalogue entry.
"""

from __future__ import annotations

from functools import lru_cache

from kael.backends import catalogue

from ._cases import KERNEL_TOL, Call, Case, vals
from ._layout import Alias, Operand, Out, host_bits
from ._run import REFERENCE, check_decomposition, check_kernel, host_values
from ._table_elementwise import elementwise_cases
from ._table_fused import fused_cases
from ._table_quant import LINEAR_TOL, quant_cases
from ._table_structured import indexing_cases, matmul_cases, reduction_cases

__all__ = [
    "Case",
    "Call",
    "Operand",
    "Out",
    "Alias",
    "REFERENCE",
    "all_cases",
    "cases_for",
    "primitive_cases",
    "fused_op_cases",
    "check_kernel",
    "check_decomposition",
    "host_bits",
    "host_values",
    "vals",
    "KERNEL_TOL",
    "LINEAR_TOL",
]

RANDOM_OPS = frozenset({"uniform", "normal", "randint"})


@lru_cache(maxsize=1)
def all_cases() -> tuple[Case, ...]:
    """Every row of the table (random kernels have their own statistical tests)."""
    return tuple(
        elementwise_cases() + reduction_cases() + matmul_cases() + indexing_cases() + fused_cases() + quant_cases()
    )


def primitive_cases() -> tuple[Case, ...]:
    return tuple(c for c in all_cases() if c.op in catalogue.PRIMITIVES)


def fused_op_cases() -> tuple[Case, ...]:
    return tuple(c for c in all_cases() if c.op in catalogue.FUSED)


def cases_for(op: str) -> tuple[Case, ...]:
    return tuple(c for c in all_cases() if c.op == op)
