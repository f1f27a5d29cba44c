"""The exceptions dbml raises.

    DbmlError                  every error dbml raises on purpose
    ├── InvalidArgument        a SQL or Python argument is wrong; the message names it and the fix
    │   ├── SourceError        the source is not one SELECT / a table, or it is empty
    │   └── ModelNotFound      no model of that name in the catalog
    ├── TrainingError          training failed (e.g. the loss became NaN); nothing was stored
    └── CatalogError           the catalog tables are not what this dbml expects

Inside DuckDB every one of them surfaces as the UDF's error, its message unchanged, so
callers can match on the text whether they call Python or SQL.
"""


class DbmlError(Exception):
    """Base of every error dbml raises on purpose."""


class InvalidArgument(DbmlError, ValueError):
    """An argument is wrong: the message names the argument and the fix."""


class SourceError(InvalidArgument):
    """The training / evaluation source is not a single SELECT or table, or it yields no rows."""


class ModelNotFound(InvalidArgument, LookupError):
    """No model of that name in the catalog."""


class TrainingError(DbmlError, RuntimeError):
    """Training failed; nothing was written to the catalog."""


class CatalogError(DbmlError):
    """The catalog tables exist but are not what this version of dbml expects."""
