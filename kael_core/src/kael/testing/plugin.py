"""The kael pytest plugin: it lives in the top-level module ``kael_pytest`` (see there).

This module re-exports it under its old name: the same objects, and the same ``__all__``.
"""

from kael_pytest import *  # noqa: F403
from kael_pytest import __all__ as __all__
