"""Fixtures of the conformance kit, also when the kael pytest plugin is not registered.

Normally ``kael_pytest`` (entry point ``pytest11``) provides ``--kael-backend``
and these fixtures. Importing them here keeps the kit collectable where the plugin
is absent (kael used from a source tree, or ``-p no:kael_testing``): every test then
skips instead of failing on a missing fixture.
"""

from kael_pytest import kael_backend, kael_device

__all__ = ["kael_backend", "kael_device"]
