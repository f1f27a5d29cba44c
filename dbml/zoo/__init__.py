"""The model zoo (``dbml.zoo``): the architectures ``train(..., arch := ...)`` builds by name,
each with documented options, and the models registered from Python.

``Inputs`` (``inputs.py``) says what a model receives; ``registry.py`` names, checks and builds
models; the architectures live in ``tabular.py``, ``vision*.py`` and ``sequence.py``. Every
model maps its inputs to float32 (B, outputs), is built deterministically from torch's global
generator, and uses only ops the scheduler's ``make_fx`` capture handles.
"""

from .inputs import KINDS, Inputs
from .registry import (ARCHS, Arch, arch, archs_for, auto, build, checked_options, describe, fitter,
                       register_model, resolve_options, unregister_model)

__all__ = ["ARCHS", "Arch", "Inputs", "KINDS", "arch", "archs_for", "auto", "build", "checked_options", "describe",
           "fitter", "register_model", "resolve_options", "unregister_model"]
