"""Loading the compiled extension ``_C`` and telling it kael's dtype objects.

``KAEL_CPU_EXTENSION=/path/to/_C....so`` loads another build of the extension in
its place (the sanitizer builds of the README's developer section), whatever way
the package itself was installed.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from types import ModuleType

from kael.backends import dtypes

__all__ = ["C"]


def _load() -> ModuleType:
    path = os.environ.get("KAEL_CPU_EXTENSION")
    if not path:
        return importlib.import_module("kael_backend_cpu._C")
    spec = importlib.util.spec_from_file_location("kael_backend_cpu._C", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"KAEL_CPU_EXTENSION={path!r} is not a loadable extension module")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["kael_backend_cpu._C"] = mod
    spec.loader.exec_module(mod)
    return mod


C: ModuleType = _load()
C._register_dtypes(tuple(dtypes.ALL_DTYPES))
