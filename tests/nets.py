"""Small models the scheduler tests train; they live in helpers.py now (use that).
Kept so that files still importing ``nets`` keep working."""

from helpers import cnn, mlp

__all__ = ["cnn", "mlp"]
