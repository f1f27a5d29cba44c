"""The tune() signature and its search space, checked before any trial runs.

``TUNE_PARAMS`` is train()'s job parameters (``spec.TRAIN_PARAMS`` but ``on_error`` and
``wait``), every trial's fixed values, then the search's own (``SEARCH_PARAMS``). From it
come the ``tune`` table macro (``tune_macro_sql``) and ``dbml_tune``'s parameter types.
``request_from_sql_row`` turns one call's arguments into a :class:`TuneRequest`: the base
:class:`~dbml.core.spec.TrainSpec` every trial starts from, the parsed :class:`Space` and the
search settings, each checked with an error that names the argument and the fix.

A space is a JSON object, one entry per searched parameter::

    {"lr": {"log_uniform": [1e-4, 0.1]}, "batch_size": {"choice": [32, 128]},
     "hidden": {"choice": [[64], [128, 64]]}, "options.width": {"int": [32, 256]}}

``uniform`` / ``log_uniform`` draw a DOUBLE parameter from a range, ``int`` / ``log_int`` an
integer one, ``choice`` lists the values (of the parameter's type). A parameter is one of
``SEARCHABLE`` or ``options.<name>``, an option of the (fixed) ``arch``. This module does
not import Optuna (``dbml.tuning`` maps a space to Optuna's distributions).
"""

from __future__ import annotations

import dataclasses
import difflib
import itertools
import json
import math
import random
from dataclasses import dataclass

from sqlglot import exp

from ..errors import InvalidArgument
from ..core.spec import TRAIN_PARAMS, Param, TrainSpec, from_sql_row, macro, macro_arguments

SEARCH_PARAMS = (
    Param("space", "VARCHAR", None),       # the search space, a JSON object (module docstring)
    Param("trials", "INTEGER", None),      # NULL: DEFAULT_TRIALS, or every untried point of a grid
    Param("parallel", "INTEGER", None),    # NULL: as many as the shared scheduler admits
    Param("objective", "VARCHAR", "val_loss"),
    Param("pruner", "VARCHAR", "median"),
    Param("sampler", "VARCHAR", "tpe"),
)
TUNE_PARAMS = tuple(p for p in TRAIN_PARAMS if p.in_spec) + SEARCH_PARAMS

# objective -> the direction it improves in. val_loss: the loss on the held-out rows;
# val_metric: accuracy or R^2 on them; loss: the epoch's training loss (no extra pass).
OBJECTIVES = {"val_loss": "minimize", "val_metric": "maximize", "loss": "minimize"}
PRUNERS = ("median", "successive_halving", "none")
SAMPLERS = ("tpe", "random", "grid")
DEFAULT_TRIALS = 20
MAX_GRID = 10_000   # the most points a grid may have, and values a choice may list
MAX_TRIALS = 10_000  # the most trials one tune() call runs (a later call resumes the search)
MAX_PARALLEL = 256   # the most trials at once: each is a job, a thread and a cursor of its own
# train() parameters a space may search; the others describe the data, the run or its memory
SEARCHABLE = ("lr", "batch_size", "optimizer", "weight_decay", "l1_reg", "momentum", "dropout", "hidden", "arch", "seed")
# distribution -> the parameter types it draws
KINDS = {"uniform": ("DOUBLE",), "log_uniform": ("DOUBLE",), "int": ("INTEGER", "BIGINT"),
         "log_int": ("INTEGER", "BIGINT"), "choice": ("DOUBLE", "INTEGER", "BIGINT", "VARCHAR", "INTEGER[]", "BOOLEAN")}
# an integer parameter's SQL type -> the values it holds (as train() takes them from SQL)
INT_RANGES = {"INTEGER": (-2 ** 31, 2 ** 31 - 1), "BIGINT": (-2 ** 63, 2 ** 63 - 1)}
EXAMPLE = '\'{"lr": {"log_uniform": [1e-4, 0.1]}, "batch_size": {"choice": [32, 128]}}\''
_TYPES = {p.name: p.sql_type for p in TRAIN_PARAMS}


@dataclass(frozen=True)
class Dimension:
    """One searched parameter: a train() parameter or ``options.<name>``, drawn as ``kind``."""
    name: str
    kind: str              # a key of KINDS
    sql_type: str          # the parameter's type
    low: float | None = None
    high: float | None = None
    choices: tuple = ()

    @property
    def log(self) -> bool:
        return self.kind.startswith("log_")

    def ends(self) -> tuple:
        """The values that bound what it draws: a range's ends, or every choice."""
        return self.choices if self.kind == "choice" else (self.low, self.high)

    def size(self) -> int:
        """How many values :meth:`points` lists, counted without listing them."""
        if self.kind == "choice" or self.sql_type == "DOUBLE":
            return len(self.points())
        return max(0, int(self.high) - int(self.low) + 1)

    def points(self) -> tuple:
        """Every value it can take (a grid's axis); a DOUBLE range has no such list."""
        if self.kind == "choice":
            return self.choices
        if self.sql_type == "DOUBLE":
            raise InvalidArgument(f"tune(): sampler 'grid' tries listed values, and space's {self.name} is a "
                                  f"{self.kind} range; pass {self.name}: {{\"choice\": [...]}}, or sampler := 'tpe'")
        return tuple(range(int(self.low), int(self.high) + 1))


@dataclass(frozen=True)
class Space:
    dims: tuple[Dimension, ...]

    def names(self) -> list[str]:
        return [d.name for d in self.dims]

    def apply(self, base: TrainSpec, values: dict) -> TrainSpec:
        """``base`` with the drawn ``values`` (name -> value, JSON types); TrainSpec checks them."""
        fields, options = {}, None
        for d in self.dims:
            if d.name not in values:
                continue
            value = _as_type(values[d.name], d.sql_type)
            if d.name.startswith("options."):
                options = options if options is not None else base.options_dict()
                options[d.name.removeprefix("options.")] = value
            else:
                fields[d.name] = value
        if options is not None:
            fields["options"] = json.dumps(options)
        return dataclasses.replace(base, **fields)

    def grid(self, seed: int = 0) -> list[dict]:
        """Every point of the space's grid, the smallest in memory (``corner``) first, the
        others in an order drawn with ``seed``."""
        size = math.prod(d.size() for d in self.dims)   # counted before any axis is listed
        if size > MAX_GRID:
            raise InvalidArgument(f"tune(): space's grid has {size} points, more than {MAX_GRID}; "
                                  f"list fewer values, or pass sampler := 'tpe'")
        axes = [d.points() for d in self.dims]
        points = [dict(zip(self.names(), p)) for p in itertools.product(*axes)]
        corner = self.corner()
        first = next(i for i, p in enumerate(points) if all(p[k] == v for k, v in corner.items()))
        rest = points[:first] + points[first + 1:]
        # the others in an order drawn with ``seed`` (as Optuna's GridSampler): a search cut
        # short, or pruned against the median, sees the whole space, not one corner of it
        order = random.Random(seed).sample(range(len(rest)), len(rest))
        return [points[first]] + [rest[i] for i in order]

    def corner(self) -> dict:
        """The values of the dimensions that change a trial's memory, each at its smallest
        (``_memory_rank``): the first trial, which tells whether the budget fits any."""
        return {d.name: min(d.ends(), key=lambda v, d=d: _memory_rank(d.name, v))
                for d in self.dims if _changes_memory(d.name)}


def _changes_memory(name: str) -> bool:
    """Whether a parameter changes how much memory a trial needs: the batch, the model's
    size, the optimizer's state, dropout's masks; the arch's numeric options."""
    return name in ("batch_size", "hidden", "optimizer", "dropout") or name.startswith("options.")


def _memory_rank(name: str, value):
    """Smaller is less memory, for one parameter's values (hidden: weights between layers,
    as if 16 features; optimizer: its state per parameter)."""
    if name == "optimizer":
        from ..scheduler import OptimizerSpec  # torch comes with the scheduler: imported when a tune runs
        from ..scheduler.graph.capture import state_keys
        return len(state_keys(OptimizerSpec(kind=value)))
    if isinstance(value, (list, tuple)):
        return sum(a * b for a, b in zip([16, *value], value)), len(value)
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else 0


@dataclass(frozen=True)
class TuneRequest:
    """One tune() call, checked: every trial is ``space.apply(base, drawn values)``."""
    base: TrainSpec
    space: Space
    trials: int | None      # None: DEFAULT_TRIALS, or a grid's untried points
    parallel: int | None    # None: as many as admission lets run
    objective: str
    pruner: str
    sampler: str

    @property
    def model(self) -> str:
        return self.base.model

    @property
    def direction(self) -> str:
        return OBJECTIVES[self.objective]


def request_from_sql_row(row: tuple) -> TuneRequest:
    """``dbml_tune``'s arguments (TUNE_PARAMS, then SETTINGS) -> the checked request."""
    args = dict(zip((p.name for p in TUNE_PARAMS), row))
    settings = row[len(TUNE_PARAMS):]
    base, _ = from_sql_row(tuple(args.get(p.name, p.default) for p in TRAIN_PARAMS) + tuple(settings))
    return make_request(base, args["space"], args["trials"], args["parallel"], args["objective"],
                        args["pruner"], args["sampler"])


def make_request(base: TrainSpec, space, trials: int | None, parallel: int | None, objective: str,
                 pruner: str, sampler: str) -> TuneRequest:
    """A TuneRequest from a base spec and the search's arguments (``space``: JSON text or a
    dict); InvalidArgument naming the first wrong one."""
    _one_of("objective", objective, OBJECTIVES)
    _one_of("pruner", pruner, PRUNERS)
    _one_of("sampler", sampler, SAMPLERS)
    for name, value in (("trials", trials), ("parallel", parallel)):
        if value is not None and (isinstance(value, bool) or int(value) != value or value < 1):
            raise InvalidArgument(f"tune(): {name} must be a positive integer, got {value!r}; "
                                  f"pass e.g. {name} := {DEFAULT_TRIALS if name == 'trials' else 4}")
    if trials is not None and trials > MAX_TRIALS:   # each trial trains a model: a typo, not a search
        raise InvalidArgument(f"tune(): trials := {trials} is more than {MAX_TRIALS}; pass fewer, and call tune() "
                              f"again to resume the search for more")
    if base.folds is not None:   # training.fit runs each trial: folds are train()'s (training.cross_validate)
        raise InvalidArgument(f"tune(): folds := {base.folds} is train()'s cross-validation; tune() scores each "
                              f"trial on its validation rows: leave folds out, and pass it to train() with the "
                              f"best trial's arguments")
    if parallel is not None and parallel > MAX_PARALLEL:   # every trial at once: a thread and a cursor each
        raise InvalidArgument(f"tune(): parallel := {parallel} is more than {MAX_PARALLEL} trials at once; pass "
                              f"fewer, or leave parallel NULL (as many as the memory budget admits)")
    if objective != "loss" and base.validation == 0:
        raise InvalidArgument(f"tune(): objective {objective!r} is measured on held-out rows, and validation is "
                              f"{base.validation}; pass validation := 0.1, or objective := 'loss'")
    parsed = parse_space(space, base)
    if sampler == "grid":
        parsed.grid()   # every dimension listable, and not too many points
    return TuneRequest(base, parsed, trials, parallel, objective, pruner, sampler)


def _one_of(name: str, value, allowed) -> None:
    if value not in allowed:
        raise InvalidArgument(f"tune(): unknown {name} {value!r}; pass {name} := one of "
                              f"{', '.join(map(repr, allowed))}")


# -- the space ---------------------------------------------------------------------------

def parse_space(space, base: TrainSpec) -> Space:
    """``space`` (JSON text or a dict) as a Space, every value it can draw checked against
    train()'s own rules on ``base``; InvalidArgument naming the parameter and the fix."""
    if space is None:
        raise InvalidArgument(f"tune(): space is missing; pass the parameters to search, e.g. space := {EXAMPLE}")
    if isinstance(space, str):
        try:
            space = json.loads(space)
        except ValueError as e:
            raise InvalidArgument(f"tune(): space is not valid JSON ({e}); pass e.g. space := {EXAMPLE}") from None
        except RecursionError:   # [[[[...: deeper than Python's decoder goes, and than any space
            raise InvalidArgument(f"tune(): space is nested too deeply to be a search space; pass an object of "
                                  f"parameter -> distribution, e.g. space := {EXAMPLE}") from None
    if not isinstance(space, dict):
        raise InvalidArgument(f"tune(): space must be a JSON object of parameter -> distribution, got "
                              f"{json.dumps(space)[:60]}; pass e.g. space := {EXAMPLE}")
    if not space:
        raise InvalidArgument(f"tune(): space is empty; name at least one parameter to search, e.g. space := {EXAMPLE}")
    dims = tuple(_dimension(name, value, base) for name, value in space.items())
    if "arch" in space and any(d.name.startswith("options.") for d in dims):
        raise InvalidArgument("tune(): space searches arch and options of an arch; options.<name> belong to one "
                              "arch: pass arch := '<name>' fixed, or search arch alone")
    parsed = Space(dims)
    for d in dims:
        for value in d.ends():
            try:
                parsed.apply(base, {d.name: value})
            except InvalidArgument as e:
                shown = json.dumps(value)
                shown = shown if len(shown) <= 80 else shown[:80] + "..."   # a 1 MB string, not all of it
                raise InvalidArgument(f"tune(): space's {d.name} reaches {shown}, which train() refuses: "
                                      f"{e}") from None
    return parsed


def _dimension(name, value, base: TrainSpec) -> Dimension:
    sql_type = _parameter_type(name, base)
    form = "an object such as {\"log_uniform\": [1e-4, 0.1]} or {\"choice\": [...]}"
    if not isinstance(value, dict) or len(value) != 1:
        raise InvalidArgument(f"tune(): space's {name} must be {form}, with one of {', '.join(KINDS)}; "
                              f"got {json.dumps(value)[:60]}")
    (kind, arg), = value.items()
    if kind not in KINDS:
        close = difflib.get_close_matches(str(kind), list(KINDS), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise InvalidArgument(f"tune(): space's {name} has an unknown distribution {kind!r}{hint}; "
                              f"use one of {', '.join(KINDS)}")
    if sql_type not in KINDS[kind]:
        fits = [k for k, types in KINDS.items() if sql_type in types]
        raise InvalidArgument(f"tune(): space's {name} takes {_describe(sql_type)} values, which {kind} does not "
                              f"draw; use {' or '.join(fits)}")
    if kind == "choice":
        dim = Dimension(name, kind, sql_type, choices=_choices(name, arg, sql_type))
    else:
        dim = Dimension(name, kind, sql_type, *_range(name, kind, arg))
    for value in dim.ends():
        _held(name, value, sql_type)
    return dim


def _held(name: str, value, sql_type: str) -> None:
    """InvalidArgument unless the parameter's SQL type holds ``value`` (each element of a list),
    as train() takes it from SQL: 1e300 is no INTEGER (a trial drawing it failed inside DuckDB)."""
    low, high = INT_RANGES.get(sql_type.removesuffix("[]"), (None, None))
    for v in value if isinstance(value, (list, tuple)) else (value,):
        if low is not None and not low <= v <= high:
            shown = json.dumps(v) if abs(v) < 1e15 else f"{float(v):.6g}"   # 1e300, not its 301 digits
            raise InvalidArgument(f"tune(): space's {name} reaches {shown}, which its type {sql_type} does "
                                  f"not hold (from {low} to {high}); pass values in that range")


def _parameter_type(name, base: TrainSpec) -> str:
    """The SQL type of a searchable ``name``, or InvalidArgument saying what can be searched."""
    if not isinstance(name, str):
        raise InvalidArgument(f"tune(): space's keys must be parameter names, got {name!r}")
    if name.startswith("options."):
        return _option_type(name, base)
    if name in SEARCHABLE:
        return _TYPES[name]
    known = list(SEARCHABLE) + ["options.<name>"]
    if name in _TYPES:
        why = f"{name} is the same for every trial; pass it as {name} := ... instead"
    else:
        close = difflib.get_close_matches(name, list(SEARCHABLE), n=1)
        why = f"tune() searches no parameter {name!r}" + (f" (did you mean {close[0]!r}?)" if close else "")
    raise InvalidArgument(f"tune(): space names {name!r}: {why}; it may search {', '.join(known)}")


def _option_type(name: str, base: TrainSpec) -> str:
    option = name.removeprefix("options.")
    if base.arch == "auto":
        raise InvalidArgument(f"tune(): space's {name} is an option of an arch, and arch is 'auto'; "
                              f"pass arch := '<name>' (e.g. 'mlp') so its options are known")
    from ..zoo import arch as zoo_arch   # the zoo imports torch
    defaults = zoo_arch(base.arch, fn="tune").options
    if option not in defaults:
        allowed = ", ".join(f"options.{k}" for k in defaults) or "none"
        raise InvalidArgument(f"tune(): space names {name!r}, not an option of arch {base.arch!r}; its options: "
                              f"{allowed}")
    default = defaults[option]
    if isinstance(default, bool):
        return "BOOLEAN"
    if isinstance(default, int):
        return "INTEGER"
    if isinstance(default, float):
        return "DOUBLE"
    return "INTEGER[]" if isinstance(default, tuple) else "VARCHAR"


def _range(name: str, kind: str, arg) -> tuple:
    integer = kind.endswith("int")
    if not (isinstance(arg, list) and len(arg) == 2 and all(_is_number(v) for v in arg)):
        raise InvalidArgument(f"tune(): space's {name}: {kind} takes [low, high], two numbers; "
                              f"got {json.dumps(arg)[:60]}")
    low, high = arg
    if integer and not all(float(v).is_integer() for v in (low, high)):
        raise InvalidArgument(f"tune(): space's {name}: {kind} takes two integers, got {json.dumps(arg)}; "
                              f"pass whole numbers, e.g. [16, 256]")
    if not low < high:
        raise InvalidArgument(f"tune(): space's {name}: {kind} needs low < high, got {json.dumps(arg)}")
    if kind.startswith("log_") and low <= 0:
        raise InvalidArgument(f"tune(): space's {name}: {kind} needs low > 0 (a logarithm), got {json.dumps(arg)}; "
                              f"use {'int' if integer else 'uniform'} for a range from {low}")
    return (int(low), int(high)) if integer else (float(low), float(high))


def _choices(name: str, arg, sql_type: str) -> tuple:
    if not isinstance(arg, list) or not arg:
        raise InvalidArgument(f"tune(): space's {name}: choice takes a non-empty list of values, "
                              f"got {json.dumps(arg)[:60]}")
    if len(arg) > MAX_GRID:   # each value is checked, and the sampler weighs each at every trial
        raise InvalidArgument(f"tune(): space's {name}: choice lists {len(arg)} values, more than {MAX_GRID}; "
                              f"list fewer, or draw from a range (int, uniform)")
    for value in arg:
        if not _has_type(value, sql_type):
            raise InvalidArgument(f"tune(): space's {name} takes {_describe(sql_type)} values, got "
                                  f"{json.dumps(value)[:60]}")
    values = tuple(_as_type(v, sql_type) for v in arg)
    if len({json.dumps(v) for v in values}) < len(values):
        raise InvalidArgument(f"tune(): space's {name} lists a value twice: {json.dumps(arg)[:80]}")
    return tuple(list(v) if isinstance(v, tuple) else v for v in values)


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _has_type(value, sql_type: str) -> bool:
    if sql_type == "DOUBLE":
        return _is_number(value)
    if sql_type in ("INTEGER", "BIGINT"):
        return _is_number(value) and float(value).is_integer()
    if sql_type == "INTEGER[]":
        return isinstance(value, list) and bool(value) and all(_has_type(v, "INTEGER") for v in value)
    return isinstance(value, bool) if sql_type == "BOOLEAN" else isinstance(value, str)


def _as_type(value, sql_type: str):
    """A JSON value as the parameter wants it: 32.0 -> 32 for an INTEGER, lists as tuples."""
    if sql_type == "DOUBLE":
        return float(value)
    if sql_type in ("INTEGER", "BIGINT"):
        return int(value)
    return tuple(int(v) for v in value) if sql_type == "INTEGER[]" else value


def _describe(sql_type: str) -> str:
    return {"DOUBLE": "number", "INTEGER": "integer", "BIGINT": "integer", "VARCHAR": "text",
            "INTEGER[]": "list-of-integers", "BOOLEAN": "boolean"}[sql_type]


def tune_macro_sql() -> exp.Create:
    """The ``tune`` table macro: TUNE_PARAMS with their defaults, passed to ``dbml_tune`` with
    every setting, the calling connection's id and its TEMP objects (as ``train``); one row
    per trial the call ran."""
    recursive = exp.PropertyEQ(this=exp.to_identifier("recursive"), expression=exp.true())
    rows = exp.select(exp.func("unnest", exp.func("dbml_tune", *macro_arguments(TUNE_PARAMS)), recursive))
    return macro("tune", TUNE_PARAMS, rows, table=True)
