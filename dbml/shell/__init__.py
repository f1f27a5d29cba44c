"""The shell, ``python -m dbml shell``: DuckDB's CLI, with dbml installed in the database.

DuckDB's own CLI cannot host Python UDFs, so dbml brings a shell that behaves like it: the
same options (``options.py``), dot commands (``commands.py``, ``catalog_commands.py``),
display modes (``render.py``; ``duckbox.py`` is DuckDB's own box renderer) and input rules
(``reader.py``, ``session.py``), tested against DuckDB's shell test suite
(``benchmarks/duckdb_shell_conformance.py``). The rest of dbml is imported when a statement
first needs it: a shell that runs plain SQL never imports torch.
"""

from .options import main, open_database
from .session import CONTINUE, PROMPT, Shell, run

__all__ = ["Shell", "main", "open_database", "run", "PROMPT", "CONTINUE"]
