"""The shell, ``python -m dbml shell``: its modules as one package (``session``, ``commands``, ``render``)."""

from .session import CONTINUE, PROMPT, Shell, open_database, run, split_statements, statement_complete

__all__ = ["Shell", "run", "statement_complete", "split_statements", "open_database", "PROMPT", "CONTINUE"]
