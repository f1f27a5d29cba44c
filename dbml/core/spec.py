"""The one train() signature: TRAIN_PARAMS, and TrainSpec, the validated job it describes.

``TRAIN_PARAMS`` lists train()'s parameters in order with their SQL types and defaults.
From it (and from ``settings.SETTINGS``) come:

- the ``train`` macro, generated at install by ``train_macro_sql()``: the parameters with
  their defaults, passed to the internal ``dbml_train`` followed by every setting, read
  with ``getvariable``;
- ``dbml_train``'s DuckDB parameter types (``dbml.udfs.types.TRAIN_ARGS``);
- ``TrainSpec`` itself (``make_dataclass``): what the user asked for, one field per parameter
  but ``on_error`` and ``wait`` (how the statement treats its jobs, not a job), each with the
  table's default; then ``settings``, a ``JobSettings``: the environment the job runs in, one
  field per setting named as the setting, resolved (a NULL setting takes its default). So
  ``spec.memory_budget`` is the job's own budget (``memory_budget :=``) and
  ``spec.settings.memory_budget`` the device's (``dbml_memory_budget``), as in SQL.

``from_sql_row`` turns one row of ``dbml_train``'s arguments back into a TrainSpec;
``calls_from_sql_rows`` turns a statement's rows into ``TrainCall``s.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, make_dataclass
from typing import TYPE_CHECKING

from sqlglot import exp

from ..errors import InvalidArgument
from . import placement
from .settings import DEFAULTS, SETTINGS, SOURCES, parse_bytes, resolve
from .source import value_sql

if TYPE_CHECKING:
    from ..scheduler import OptimizerSpec


@dataclass(frozen=True)
class Param:
    name: str
    sql_type: str
    default: object = None
    required: bool = False  # no default: positional in SQL, a TrainSpec field without a default
    size: bool = False      # bytes or a size such as '512MB': cast to VARCHAR, parsed by parse_bytes
    in_spec: bool = True    # a TrainSpec field (wait and on_error are not: they are about the statement)


TRAIN_PARAMS = (
    Param("model", "VARCHAR", required=True),
    Param("source", "VARCHAR", required=True),
    Param("label", "VARCHAR", None),
    Param("features", "VARCHAR[]", None),
    Param("arch", "VARCHAR", "auto"),
    Param("epochs", "INTEGER", 20),
    Param("batch_size", "INTEGER", 64),
    Param("lr", "DOUBLE", None),             # NULL: the arch family's (default_lr)
    Param("optimizer", "VARCHAR", "adam"),
    Param("seed", "BIGINT", 0),
    Param("validation", "DOUBLE", None),     # NULL: enough rows to mean something (default_validation)
    Param("folds", "INTEGER", None),         # k-fold cross-validation before the model: k fits, k scores
    Param("split", "VARCHAR", None),         # NULL/'random': by the rows' hash; 'custom', 'seq': by split_col (SPLITS)
    Param("split_col", "VARCHAR", None),     # the column 'custom' and 'seq' split by (not a feature)
    Param("hidden", "INTEGER[]", None),
    Param("dropout", "DOUBLE", 0.0),
    Param("options", "VARCHAR", None),       # the arch's options, a JSON object: '{"width": 64}'
    Param("task", "VARCHAR", None),
    Param("weight_decay", "DOUBLE", 0.0),    # L2: torch's weight_decay (AdamW: decoupled)
    Param("l1_reg", "DOUBLE", 0.0),          # L1: l1_reg * sign(w) added to every gradient
    Param("momentum", "DOUBLE", 0.9),
    Param("policy", "VARCHAR", "tensile"),
    Param("memory_budget", "VARCHAR", None, size=True),
    Param("measure_vanilla", "BOOLEAN", False),
    Param("image_size", "INTEGER[]", None),  # images: resize to [h, w] (or [s])
    Param("shape", "INTEGER[]", None),       # a numeric array column as an image: [c, h, w]
    Param("text", "VARCHAR[]", None),        # VARCHAR columns to read as text
    Param("series_scale", "VARCHAR", "global"),  # series: one mean/std for all ('global') or each row's own ('row')
    Param("early_stop", "BOOLEAN", True),    # stop when the validation loss stops falling; keep the best epoch
    Param("patience", "INTEGER", 5),         # ... after this many epochs without a better one
    Param("workers", "INTEGER", 1),           # > 1: data-parallel on a Ray cluster (dbml.cluster.parallel)
    Param("on_error", "VARCHAR", "raise", in_spec=False),
    Param("wait", "BOOLEAN", True, in_spec=False),
)
# tensile: the TENSILE scheduler within the budget; none: the same captured graph, tensors
# released after their last use, no budget; eager: plain PyTorch (the vanilla); capuchin:
# passive mode, the cold-start peer (swap on demand in iteration 1, then plan from it);
# vdnn: vDNN-conv, the layer-granularity baseline (convolutions' inputs offloaded, no budget);
# pooch, swapadvisor: the seeds' other planners, searching a plan by simulation within the budget.
SQL_POLICIES = ("tensile", "none", "eager", "capuchin", "vdnn", "pooch", "swapadvisor")
# How train() holds rows out (dbml.core.heldout owns the rule), BigQuery ML's data_split_method:
# random: by a hash of each row (validation's share); custom: the rows whose BOOLEAN split_col
# is TRUE; seq: the last validation share of the rows ordered by split_col.
SPLITS = ("random", "custom", "seq")
# raise: a failed or cancelled row makes the statement raise its error (after every job has
# ended); continue: every row returns its summary, with status and error.
ON_ERROR = ("raise", "continue")
# How a FLOAT[]/DOUBLE[] series is standardised (dbml.core.input_modules.SeriesScale): global: with the
# mean and std of every training value; row: each series with its own.
SERIES_SCALES = ("global", "row")
# The largest learning rate: an update multiplies by it in FLOAT, and no model learns at more.
MAX_LR = 1e6


class _JobSettingsChecks:
    """JobSettings' behaviour; its fields come from ``settings.SETTINGS`` (see ``JobSettings`` below)."""

    def check(self) -> None:
        """InvalidArgument naming the setting and the fix (``TrainSpec`` checks its own with it)."""
        if not 0.0 < self.replan_beta <= 1.0 or not self.replan_threshold > 0:
            raise InvalidArgument(f"train(): plan updating needs 0 < replan_beta <= 1 and replan_threshold > 0; "
                                  f"SET VARIABLE dbml_replan_beta = {DEFAULTS['replan_beta']}, "
                                  f"dbml_replan_threshold = {DEFAULTS['replan_threshold']}")
        if self.sources not in SOURCES:
            raise InvalidArgument(f"setting sources is {self.sources!r}; SET VARIABLE dbml_sources = 'any' or 'tables'")


class _TrainSpecChecks:
    """TrainSpec's behaviour; its fields come from the tables (see ``TrainSpec`` below)."""

    def _check_split(self, fn: str) -> None:
        """split and split_col (``SPLITS``) agree with each other, validation and folds."""
        if self.split is not None and self.split not in SPLITS:
            raise InvalidArgument(f"{fn}(): unknown split {self.split!r}; pass split := one of "
                                  f"{', '.join(map(repr, SPLITS))}")
        split = self.split or "random"
        if split == "random":
            if self.split_col is not None:
                raise InvalidArgument(f"{fn}(): split_col := {self.split_col!r} is read by split := 'custom' (its "
                                      f"TRUE rows held out) or split := 'seq' (ordered by it); pass one of them, or "
                                      f"leave split_col out")
            return
        if not self.split_col:
            raise InvalidArgument(f"{fn}(): split := {split!r} splits by a column; pass split_col := '<column>' ("
                                  + ("a BOOLEAN column, TRUE for the rows to hold out)" if split == "custom" else
                                     "the rows ordered by it, the last validation share held out)"))
        if split == "custom" and self.validation is not None:
            raise InvalidArgument(f"{fn}(): with split := 'custom' the column {self.split_col!r} decides which rows "
                                  f"are held out; leave validation := {self.validation!r} out")
        if self.folds is not None:
            raise InvalidArgument(f"{fn}(): folds := {self.folds!r} splits the rows by their hash, and split := "
                                  f"{split!r} by {self.split_col!r}; pass one of them")

    def __post_init__(self):
        fn = "train"
        if not self.model or not self.model.strip():
            raise InvalidArgument(f"{fn}(): model name is empty; pass a name such as train('churn', ...)")
        if "@" in self.model:
            raise InvalidArgument(f"{fn}(): model name {self.model!r} holds '@', which names a version "
                                  f"(predict('churn@2', ...)); pass a name without it")
        _positive_int(self.epochs, "epochs", "epochs := 10")
        _positive_int(self.batch_size, "batch_size", "batch_size := 64")
        if self.lr is not None and not 0 < self.lr <= MAX_LR:
            raise InvalidArgument(f"{fn}(): lr must be a positive number up to {MAX_LR:g}, got {self.lr!r}; "
                                  f"pass e.g. lr := 0.01")
        _positive_int(self.patience, "patience", "patience := 5")
        from ..scheduler.graph.optim import OPTIMIZERS   # plain names: no torch
        if self.optimizer not in OPTIMIZERS:
            raise InvalidArgument(f"{fn}(): unknown optimizer {self.optimizer!r}; "
                                  f"pass optimizer := one of {', '.join(map(repr, OPTIMIZERS))}")
        if self.arch != "auto":
            from ..zoo import arch as zoo_arch   # the zoo imports torch: only for an arch named
            zoo_arch(self.arch, fn=fn)   # an unknown arch fails here, before anything runs
        from .arguments import arguments   # the arch's arguments, as far as they need no data: config's own checks
        arguments(self.arch, self.options_dict(), hidden=self.hidden, dropout=self.dropout, fn=fn)
        if self.series_scale not in SERIES_SCALES:
            raise InvalidArgument(f"{fn}(): unknown series_scale {self.series_scale!r}; "
                                  f"pass series_scale := one of {', '.join(map(repr, SERIES_SCALES))}")
        if self.validation is not None and not 0.0 <= self.validation < 1.0:
            raise InvalidArgument(f"{fn}(): validation must be a fraction in [0, 1), got {self.validation!r}; "
                                  f"pass e.g. validation := 0.1")
        if self.folds is not None and (isinstance(self.folds, bool) or not isinstance(self.folds, int)
                                       or not 2 <= self.folds <= MAX_FOLDS):
            raise InvalidArgument(f"{fn}(): folds must be a whole number from 2 to {MAX_FOLDS}, got {self.folds!r}; "
                                  f"pass e.g. folds := 5 (or leave it out: no cross-validation)")
        self._check_split(fn)
        if self.policy not in SQL_POLICIES:
            raise InvalidArgument(f"{fn}(): unknown policy {self.policy!r}; "
                                  f"pass policy := one of {', '.join(map(repr, SQL_POLICIES))}")
        self.settings.check()
        if self.weight_decay is None or not 0 <= self.weight_decay < math.inf:
            raise InvalidArgument(f"{fn}(): weight_decay must be a finite number >= 0, got {self.weight_decay!r}; "
                                  f"pass e.g. weight_decay := 0.01")
        _positive_int(self.workers, "workers", "workers := 2")
        if not placement.is_local(self):   # where a job may run: the backend's rules, in one place
            placement.backend(self).check_job(self)
        if self.l1_reg is None or not 0 <= self.l1_reg < math.inf:
            raise InvalidArgument(f"{fn}(): l1_reg must be a finite number >= 0, got {self.l1_reg!r}; "
                                  f"pass e.g. l1_reg := 0.001")
        if self.momentum is None or not 0 <= self.momentum < 1:
            raise InvalidArgument(f"{fn}(): momentum must be in [0, 1), got {self.momentum!r}; "
                                  f"pass e.g. momentum := 0.9")

    def options_dict(self) -> dict:
        """``options``, a JSON object, as a dict; InvalidArgument if it is not one."""
        if self.options is None:
            return {}
        try:
            value = json.loads(self.options)
        except ValueError:
            value = None
        if not isinstance(value, dict):
            raise InvalidArgument(f"train(): options must be a JSON object such as '{{\"width\": 64}}', "
                                  f"got {self.options!r}")
        return value

    def optimizer_spec(self) -> OptimizerSpec:
        from ..scheduler import OptimizerSpec
        return OptimizerSpec(kind=self.optimizer, lr=self.lr, momentum=self.momentum,
                             weight_decay=self.weight_decay, l1=self.l1_reg)


_PYTHON_TYPES = {"VARCHAR": "str", "BOOLEAN": "bool", "INTEGER": "int", "BIGINT": "int", "DOUBLE": "float",
                 "VARCHAR[]": "tuple[str, ...]", "INTEGER[]": "tuple[int, ...]"}


def _annotation(sql_type: str, size: bool, default) -> str:
    python = "int" if size else _PYTHON_TYPES[sql_type]   # sizes are parsed to bytes
    return python if default is not None else f"{python} | None"


def _settings_fields() -> list[tuple]:
    """JobSettings' fields: one per setting, named as it, with its default."""
    return [(st.name, _annotation(st.sql_type, st.size, st.default), field(default=st.default)) for st in SETTINGS]


def _spec_fields() -> list[tuple]:
    """TrainSpec's fields: train()'s parameters (but ``wait`` and ``on_error``), then ``settings``."""
    out = [(p.name, _annotation(p.sql_type, p.size, None if p.required else p.default))
           + (() if p.required else (field(default=p.default),)) for p in TRAIN_PARAMS if p.in_spec]
    out.append(("settings", "JobSettings", field(default_factory=JobSettings)))
    return out


# The settings a job runs under, resolved (a NULL setting is its default): derived from
# settings.SETTINGS, so that a setting added there is a field here, with the same default.
JobSettings = make_dataclass("JobSettings", _settings_fields(), bases=(_JobSettingsChecks,), frozen=True)
JobSettings.__module__ = __name__
JobSettings.__doc__ = "The settings of a train() job, resolved: one field per setting, named as it."

# The validated job train() describes: what the user asked for (TRAIN_PARAMS), then the
# environment it runs in (``settings``). Derived from the two tables, so that a parameter
# or a setting added there is a field here, with the same default.
TrainSpec = make_dataclass("TrainSpec", _spec_fields(), bases=(_TrainSpecChecks,), frozen=True)
TrainSpec.__module__ = __name__
TrainSpec.__doc__ = ("A validated train() job: one field per TRAIN_PARAMS entry (but wait and on_error), then "
                     "its JobSettings.")


# The catalog's params (dbml_models.params) are one flat object, the parameters' then the
# settings', as stored since the first catalog: there the memory_budget setting is stored as
# device_budget, beside the job's own memory_budget. A stored format, not a name in the code.
STORED_KEYS = {"memory_budget": "device_budget"}


def stored_key(setting: str) -> str:
    """The key of ``setting`` in the catalog's params (``STORED_KEYS``)."""
    return STORED_KEYS.get(setting, setting)


def stored_params(spec: TrainSpec) -> dict:
    """``spec`` as the catalog stores it in params: its fields but model, source and settings,
    then each setting under its ``stored_key``."""
    out = {f: v for f, v in asdict(spec).items() if f not in ("model", "source", "settings")}
    out.update((stored_key(k), v) for k, v in asdict(spec.settings).items())
    return out


# lr := NULL: a learning rate per arch family (issue 24: Adam at 0.01 overfit a small tabular
# regression to test R^2 0.09 where 0.001 gave 0.34, and image models swung 0.63-0.86 across
# seeds). Linear models start from zero weights and take larger steps; SGD a larger one.
FAMILY_LR = {"linear": 1e-2, "bow": 1e-2, "mlp": 1e-3, "resnet_tabular": 1e-3, "ft_transformer": 1e-4,
             "cnn": 1e-3, "transformer": 1e-3, "tcn": 1e-3}
DEFAULT_LR = 1e-3                 # any other arch (the paper's CNNs, registered ones) with Adam
SGD_LR_FACTOR = 10.0              # SGD's step: ten times Adam's
MIN_VALIDATION, MAX_VALIDATION, VALIDATION_ROWS = 0.1, 0.25, 200
MAX_FOLDS = 20   # folds: each fold is a fit of its own


def default_lr(arch: str, optimizer: str) -> float:
    """The learning rate a job with ``lr := NULL`` trains at: its arch family's."""
    lr = FAMILY_LR.get(arch, DEFAULT_LR)
    return lr * SGD_LR_FACTOR if optimizer == "sgd" else lr


def default_validation(rows: int) -> float:
    """The share of rows held out with ``validation := NULL``: enough to mean something,
    ``VALIDATION_ROWS`` where that is between 10 % and 25 % of the rows (33 rows of 330 gave
    a validation R^2 of 0.40 for a model whose test R^2 was 0.09)."""
    return min(MAX_VALIDATION, max(MIN_VALIDATION, VALIDATION_ROWS / max(rows, 1)))


def _positive_int(value, name: str, example: str) -> None:
    if value is None or int(value) != value or value <= 0:
        raise InvalidArgument(f"train(): {name} must be a positive integer, got {value!r}; pass e.g. {example}")


def from_sql_row(row: tuple) -> tuple[TrainSpec, bool]:
    """One row of ``dbml_train``'s arguments (TRAIN_PARAMS, then SETTINGS) -> (spec, wait).

    NULL settings take their defaults (``settings.resolve``); sizes are parsed, lists
    become tuples. Raises InvalidArgument, naming the argument, before anything starts.
    """
    args = dict(zip((p.name for p in TRAIN_PARAMS), row))
    values = row[len(TRAIN_PARAMS):]
    fields = {p.name: _from_sql(p.sql_type, p.size, args[p.name], f"train(): {p.name}")
              for p in TRAIN_PARAMS if p.in_spec}
    settings = {setting.name: _from_sql(setting.sql_type, setting.size, resolve(setting.name, value),
                                        f"setting {setting.name}")
                for setting, value in zip(SETTINGS, values, strict=True)}
    return TrainSpec(**fields, settings=JobSettings(**settings)), args["wait"] is not False


@dataclass(frozen=True)
class TrainCall:
    """One row of a train() statement: its job's spec, or what is wrong with its arguments
    (kept only under ``on_error := 'continue'``; under 'raise' it is raised at once)."""
    model: str | None
    spec: TrainSpec | None
    error: InvalidArgument | None
    wait: bool
    on_error: str


def calls_from_sql_rows(rows) -> list[TrainCall]:
    """Every row of a statement, validated before any job starts (see ``from_sql_row``)."""
    calls = []
    for row in rows:
        args = dict(zip((p.name for p in TRAIN_PARAMS), row))
        on_error, wait = args["on_error"], args["wait"] is not False
        if on_error not in ON_ERROR:
            raise InvalidArgument(f"train(): unknown on_error {on_error!r}; "
                                  f"pass on_error := one of {', '.join(map(repr, ON_ERROR))}")
        try:
            spec, _ = from_sql_row(row)
        except InvalidArgument as e:
            if on_error == "raise":
                raise
            calls.append(TrainCall(args["model"], None, e, wait, on_error))
            continue
        calls.append(TrainCall(spec.model, spec, None, wait, on_error))
    return calls


def _from_sql(sql_type: str, size: bool, value, name: str):
    if value is None:
        return None
    if size:
        return parse_bytes(value, name=name)
    return tuple(value) if sql_type.endswith("[]") else value


def train_macro_sql() -> exp.Create:
    """The ``train`` macro (a tree): TRAIN_PARAMS with their defaults, passed to ``dbml_train``
    with every setting, the calling connection's id and its TEMP tables and views."""
    return macro("train", TRAIN_PARAMS, exp.func("dbml_train", *macro_arguments(TRAIN_PARAMS)))


def macro(name: str, params, body: exp.Expression, *, table: bool = False) -> exp.Create:
    """``CREATE OR REPLACE TEMP MACRO name(params) AS [TABLE] body``: each of ``params`` (``Param``)
    by name, with its default unless it is required."""
    declared = [exp.to_identifier(p.name) if p.required else
                exp.PropertyEQ(this=exp.to_identifier(p.name), expression=value_sql(p.default)) for p in params]
    overload = exp.MacroOverload(this=body, expressions=declared, is_table=table)
    return exp.Create(this=exp.UserDefinedFunction(this=exp.to_identifier(name)), kind="MACRO", replace=True,
                      expression=exp.MacroOverloads(expressions=[overload]),
                      properties=exp.Properties(expressions=[exp.TemporaryProperty()]))


def macro_arguments(params) -> list[exp.Expression]:
    """What a macro passes on to its ``dbml_`` function: ``params``, every setting, the calling
    connection's id and its TEMP objects. Sizes are cast to VARCHAR, as a budget may be given
    as a number of bytes or as text, and so are text settings, so that one set to a number
    (SET VARIABLE dbml_cluster = 42) is refused by its own check."""
    def size(e: exp.Expression, is_size: bool) -> exp.Expression:
        return exp.cast(e, "VARCHAR") if is_size else e
    args = [size(exp.column(p.name), p.size) for p in params]
    args += [size(exp.func("getvariable", exp.Literal.string(f"dbml_{s.name}")), s.size or s.sql_type == "VARCHAR")
             for s in SETTINGS]
    args.append(exp.cast(exp.func("current_connection_id"), "BIGINT"))   # whose interrupt() reaches the jobs
    args.append(exp.func("dbml_temp_names"))     # the caller's TEMP objects, which sources may not name
    return args
