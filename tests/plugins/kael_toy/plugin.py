"""The entry point of kael-toy (group ``kael.models``): its one model family."""

from __future__ import annotations

from typing import Any

import kael
from kael.models import ModelFamily

from ._model import load

__all__ = ["kael_model_families"]


@kael.hookimpl
def kael_model_families() -> list[Any]:
    return [ModelFamily("kael_toy", load, description="kael-toy (a test family)")]
