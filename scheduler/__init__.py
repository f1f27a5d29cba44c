"""dbml.scheduler — TENSILE memory scheduling for PyTorch training steps.

A library for any PyTorch training step: it never imports the dbml runtime.
"""

from .optim import OPTIMIZERS, OptimizerSpec, make_optimizer

__all__ = ["OPTIMIZERS", "OptimizerSpec", "make_optimizer"]
