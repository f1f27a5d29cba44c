"""``CREATE [OR REPLACE] MODEL [IF NOT EXISTS] m [TRANSFORM(...)] OPTIONS(...) AS <query>`` as a
``train`` call, built as a sqlglot tree (no name, label or option value becomes SQL text).

``MODEL_TYPES`` maps BigQuery's model types onto dbml archs; ``OPTIONS`` lists, per option,
which types take it and the ``train`` argument it becomes. An unknown or unsupported option
or type is refused, naming it, before anything trains.
"""

from __future__ import annotations

import importlib.util
import json

import duckdb

from sqlglot import exp

from ..errors import InvalidArgument
from ..core.kinds.kmeans import NO_LABEL
from ..core.source import column, refuse_effects, unused_name
from ..core.settings import SETTINGS
from ..core.spec import TRAIN_PARAMS, from_sql_row
from ..zoo import arch as zoo_arch
from . import names, preprocess, tuning
from .parse import constant, count

# model_type -> (dbml arch, task)
MODEL_TYPES = {
    "linear_reg": ("linear", "regression"), "logistic_reg": ("linear", "classification"),
    "dnn_classifier": ("dnn", "classification"), "dnn_regressor": ("dnn", "regression"),
    "dnn_linear_combined_classifier": ("wide_deep", "classification"),
    "dnn_linear_combined_regressor": ("wide_deep", "regression"),
    "boosted_tree_classifier": ("boosted_tree", "classification"),
    "boosted_tree_regressor": ("boosted_tree", "regression"),
    "random_forest_classifier": ("random_forest", "classification"),
    "random_forest_regressor": ("random_forest", "regression"),
    "kmeans": ("kmeans", "regression"),
}
REMOTE_OR_AUTOML = ("automl_classifier", "automl_regressor", "tensorflow", "tensorflow_lite", "onnx", "xgboost")
DNN = ("dnn", "wide_deep")   # the MLPs: their options are the dnn arch's
TORCH, TREES = ("linear", *DNN), ("boosted_tree", "random_forest")
ALL = TORCH + TREES + ("kmeans",)
SUPERVISED = TORCH + TREES
# option -> the archs that take it
OPTIONS = {
    "model_type": ALL, "input_label_cols": SUPERVISED, "max_iterations": TORCH + ("boosted_tree", "kmeans"),
    "early_stop": ALL,
    "min_rel_progress": ALL, "data_split_method": SUPERVISED, "data_split_eval_fraction": SUPERVISED,
    "data_split_col": SUPERVISED, "enable_global_explain": SUPERVISED, "auto_class_weights": SUPERVISED,
    "class_weights": TORCH,
    "learn_rate": TORCH + ("boosted_tree",), "ls_init_learn_rate": ("linear",), "learn_rate_strategy": ("linear",),
    "optimize_strategy": ("linear",), "l2_reg": TORCH + TREES, "l1_reg": TORCH + TREES, "batch_size": DNN,
    "hidden_units": DNN, "dropout": DNN, "activation_fn": DNN, "optimizer": DNN,
    "booster_type": ("boosted_tree",), "num_parallel_tree": TREES, "tree_method": TREES, "subsample": TREES,
    "max_tree_depth": TREES, "min_split_loss": TREES, "min_tree_child_weight": TREES,
    "colsample_bytree": TREES, "colsample_bynode": TREES,
    "num_clusters": ("kmeans",), "kmeans_init_method": ("kmeans",), "distance_type": ("kmeans",),
    "standardize_features": ("kmeans",), "num_trials": SUPERVISED, "max_parallel_trials": SUPERVISED,
    "hparam_tuning_objectives": SUPERVISED, "hparam_tuning_algorithm": SUPERVISED,
}
# BigQuery's DNN optimizers dbml has (FTRL and RMSPROP it has not)
OPTIMIZERS = {"adam": "adam", "sgd": "sgd", "adagrad": "adagrad"}

# Who reads each option (test_bigquery checks that every (option, type) pair has one owner):
# the translation itself,
TRANSLATED = ("model_type", "input_label_cols", "data_split_method", "data_split_eval_fraction", "data_split_col",
              "enable_global_explain", "num_trials", "max_parallel_trials", "hparam_tuning_objectives",
              "hparam_tuning_algorithm")
# for linear and DNN models, a train() argument (TORCH_PLAIN), an option of the dnn arch
# (DNN_OPTIONS) or a rule of _torch_arguments (TORCH_RULES);
TORCH_PLAIN = {"max_iterations": "epochs", "learn_rate": "lr", "ls_init_learn_rate": "lr",
               "batch_size": "batch_size", "l2_reg": "weight_decay", "l1_reg": "l1_reg", "optimizer": "optimizer"}
DNN_OPTIONS = {"hidden_units": "hidden", "activation_fn": "activation", "dropout": "dropout"}
TORCH_RULES = {
    "auto_class_weights": "the rarer classes' rows repeated (class_weighted)",
    "class_weights": "each class's rows repeated in proportion to its weight (class_weighted)",
    "early_stop": "train()'s early_stop: stop once the validation loss has not improved for patience epochs, "
                  "keeping the best epoch",
    "min_rel_progress": "taken with early_stop: dbml's criterion is patience (5 epochs), not a relative step",
    "learn_rate_strategy": "LINE_SEARCH and CONSTANT: dbml's lr is constant (Adam)",
    "optimize_strategy": "AUTO_STRATEGY and BATCH_GRADIENT_DESCENT: dbml descends by mini-batches",
}
TORCH_ARGUMENTS = {*TORCH_PLAIN, *DNN_OPTIONS, *TORCH_RULES}
LINEAR_LR = 0.1   # LINEAR_REG and LOGISTIC_REG without learn_rate: BigQuery's first line-search step
# and for the fitted kinds (trees, k-means), the arch's own option of the same name (dbml/kinds/).


# sqlglot names SELECT * EXCEPT's argument "except_" from version 26 on, "except" before
_EXCEPT = "except_" if "except_" in exp.Star.arg_types else "except"


def star_except(*columns: str) -> exp.Star:
    """``*`` less ``columns`` (DuckDB's ``* EXCLUDE (...)``)."""
    return exp.Star(**{_EXCEPT: [exp.column(c, quoted=True) for c in columns]})


def _value(v) -> exp.Expression:
    if isinstance(v, bool):
        return exp.Boolean(this=v)
    if isinstance(v, str):
        return exp.Literal.string(v)
    if isinstance(v, list):
        return exp.Array(expressions=[_value(x) for x in v])
    if isinstance(v, int):
        return exp.Literal.number(v) if v >= 0 else exp.Neg(this=exp.Literal.number(-v))
    return preprocess._num(v)


def model_name(table: exp.Expression) -> str:
    return table.name if isinstance(table, exp.Table) else table.sql("bigquery")


def given_options(tree: exp.Create) -> tuple[dict, list | None]:
    """OPTIONS(...) as {lower name: value}, and TRANSFORM's expressions (or None)."""
    options, transform = {}, None
    properties = tree.args.get("properties")
    for p in properties.expressions if properties is not None else []:
        if isinstance(p, exp.TransformModelProperty):
            transform = list(p.expressions)
        elif isinstance(p, exp.Property):
            found = tuning.space(p.name.lower(), p.args["value"], model_name(tree.this))
            options[p.name.lower()] = found if found is not None else constant(p.args["value"], f"option {p.name}")
        else:
            raise InvalidArgument(f"BigQuery ML: CREATE MODEL: {p.sql('bigquery')[:60]} is not supported in dbml")
    return options, transform


def model_kind(name: str, options: dict) -> tuple[str, str, str]:
    kind = str(options.get("model_type", "")).lower()
    if not kind:
        raise InvalidArgument(f"BigQuery ML: CREATE MODEL {name}: needs OPTIONS(model_type = '...'), one of "
                              f"{', '.join(MODEL_TYPES)}")
    if kind in REMOTE_OR_AUTOML:
        raise InvalidArgument(f"BigQuery ML: model_type {options['model_type']!r} (remote, imported and AutoML "
                              f"models) is not supported in dbml; use one of {', '.join(MODEL_TYPES)}")
    if kind not in MODEL_TYPES:
        raise InvalidArgument(f"BigQuery ML: model_type {options['model_type']!r} is not supported in dbml; use "
                              f"one of {', '.join(MODEL_TYPES)}")
    return (kind, *MODEL_TYPES[kind])


def check_options(name: str, kind: str, arch: str, options: dict) -> None:
    for option in options:
        if option not in OPTIONS:
            raise InvalidArgument(f"BigQuery ML: CREATE MODEL {name}: option {option} is not supported in dbml; "
                                  f"supported options are {', '.join(OPTIONS)} (the README's BigQuery ML table)")
        if arch not in OPTIONS[option]:
            raise InvalidArgument(f"BigQuery ML: CREATE MODEL {name}: option {option} is not supported for "
                                  f"model_type {kind} in dbml")


def train_arguments(name: str, kind: str, arch: str, task: str, options: dict) -> dict:
    """The named arguments of ``train`` (Python values) for the options."""
    label = options.get("input_label_cols", ["label"] if arch != "kmeans" else None)
    if arch != "kmeans" and (not isinstance(label, list) or len(label) != 1 or not isinstance(label[0], str)):
        raise InvalidArgument(f"BigQuery ML: CREATE MODEL {name}: input_label_cols must name one column, "
                              f"e.g. input_label_cols = ['price'], got {label!r}")
    args = {"label": label[0] if arch != "kmeans" else NO_LABEL, "arch": arch, "task": task, "text": []}
    if arch in TORCH:
        args.update(_torch_arguments(name, arch, options))
    else:   # a fitted kind (dbml/kinds/) takes BigQuery's options under their own names
        taken = zoo_arch(arch).options
        args["options"] = json.dumps({k: v for k, v in options.items() if k in taken})
    if arch == "kmeans":
        args["validation"] = 0.0
    return args


def _torch_arguments(name: str, arch: str, options: dict) -> dict:
    args = {TORCH_PLAIN[k]: v for k, v in options.items() if k in TORCH_PLAIN}
    if "optimizer" in options:
        opt = str(options["optimizer"]).lower()
        if opt not in OPTIMIZERS:
            raise InvalidArgument(f"BigQuery ML: CREATE MODEL {name}: optimizer {options['optimizer']!r} is not "
                                  f"supported in dbml; use one of {', '.join(o.upper() for o in OPTIMIZERS)}")
        args["optimizer"] = OPTIMIZERS[opt]
    if str(options.get("optimize_strategy", "auto_strategy")).lower() not in ("auto_strategy", "batch_gradient_descent"):
        raise InvalidArgument(f"BigQuery ML: CREATE MODEL {name}: optimize_strategy {options['optimize_strategy']!r} "
                              f"is not supported in dbml, which trains by gradient descent; use AUTO_STRATEGY or "
                              f"BATCH_GRADIENT_DESCENT")
    if str(options.get("learn_rate_strategy", "line_search")).lower() not in ("line_search", "constant"):
        raise InvalidArgument(f"BigQuery ML: CREATE MODEL {name}: learn_rate_strategy "
                              f"{options['learn_rate_strategy']!r} is not BigQuery's; use LINE_SEARCH or CONSTANT")
    if arch == "linear" and "lr" not in args:
        args["lr"] = LINEAR_LR   # BigQuery's ls_init_learn_rate default, not dbml's own for linear
    if "early_stop" in options:   # see TORCH_RULES
        args["early_stop"] = bool(options["early_stop"])
    if arch in DNN:
        dnn = {DNN_OPTIONS[k]: v for k, v in options.items() if k in DNN_OPTIONS}
        dnn["activation"] = str(dnn.get("activation", "relu")).lower()
        if "hidden" in dnn and not isinstance(dnn["hidden"], list):
            dnn["hidden"] = [dnn["hidden"]]
        args["options"] = json.dumps(dnn)
    return args


def split(name: str, options: dict, arch: str) -> dict:
    """The train arguments of the data split options: train() holds the rows out
    (``dbml.core.heldout`` owns every split's rule), ``SEQ`` and ``CUSTOM`` by ``data_split_col``."""
    method = str(options.get("data_split_method", "auto_split")).lower()
    fraction = options.get("data_split_eval_fraction", 0.2)
    col = options.get("data_split_col")
    if method in ("auto_split", "random"):
        return {} if arch == "kmeans" else {"validation": float(fraction)}
    if method == "no_split":
        return {"validation": 0.0}
    if method in ("seq", "custom") and isinstance(col, str):
        return {"split": method, "split_col": col, **({"validation": float(fraction)} if method == "seq" else {})}
    raise InvalidArgument(f"BigQuery ML: CREATE MODEL {name}: data_split_method {options['data_split_method']!r} "
                          f"is not supported (SEQ and CUSTOM need data_split_col); use AUTO_SPLIT, RANDOM, NO_SPLIT, "
                          f"SEQ or CUSTOM")


def check_split_col(con, name: str, query: exp.Select, split_args: dict) -> None:
    """DATA_SPLIT_COL in BigQuery's words, before anything trains: a column of the AS query, a
    BOOL for CUSTOM (train() would name its own split_col argument)."""
    col = split_args.get("split_col")
    if col is None:
        return
    columns = dict(zip(*_columns(con, query)))
    found = next((c for c in columns if c.lower() == col.lower()), None)
    if found is None:
        raise InvalidArgument(f"BigQuery ML: CREATE MODEL {name}: data_split_col {col!r} is not a column of the AS "
                              f"query; select it there (its columns: {', '.join(columns)})")
    if split_args["split"] == "custom" and str(columns[found]).upper() != "BOOLEAN":
        raise InvalidArgument(f"BigQuery ML: CREATE MODEL {name}: data_split_method CUSTOM reads data_split_col "
                              f"{col!r} as a BOOL (TRUE: evaluation rows), and it is {columns[found]}; select a BOOL "
                              f"column, e.g. {col} = 1 AS is_eval")


MAX_CLASS_COPIES = 100   # class_weights: the largest weight at most this many times the smallest


def class_copies(name: str, weights) -> dict:
    """``CLASS_WEIGHTS = [STRUCT('a', 0.2), STRUCT('b', 0.8)]`` as {label: copies of each row}, the
    lightest class's rows once (a class not listed weighs 1.0, as in BigQuery ML)."""
    example = "class_weights = [STRUCT('a', 0.2), STRUCT('b', 0.8)]"
    if not isinstance(weights, list) or not weights or not all(
            isinstance(w, tuple) and len(w) == 2 and isinstance(w[1], (int, float)) and not isinstance(w[1], bool)
            and w[1] > 0 for w in weights):
        raise InvalidArgument(f"BigQuery ML: CREATE MODEL {name}: class_weights must be an array of "
                              f"STRUCT(label, weight > 0), e.g. {example}; got {weights!r}")
    given = {str(label): float(w) for label, w in weights}
    lightest = min(*given.values(), 1.0)
    if max(*given.values(), 1.0) / lightest > MAX_CLASS_COPIES:
        raise InvalidArgument(f"BigQuery ML: CREATE MODEL {name}: class_weights repeat each class's rows in "
                              f"proportion to its weight; weights more than {MAX_CLASS_COPIES} times apart (a class "
                              f"not listed weighs 1.0) are not supported in dbml: bring them closer")
    return {**{label: round(w / lightest) for label, w in given.items()}, None: round(1.0 / lightest)}


def class_weighted(query: exp.Select, label: str, columns: list[str], copies: dict | None = None) -> exp.Select:
    """Class weights for the torch models, as repeated rows: ``copies`` ({label: copies, None: any
    other label's}, ``class_weights``) or, without it (``auto_class_weights``), each row repeated about
    (largest class / its class) times, so every class weighs alike in the loss. (Copies of a row
    hash alike, so the validation split keeps them together.) ``columns``: the query's, which the
    counts' names stay apart from."""
    lab = exp.column(label, quoted=True)
    n, r, i = (unused_name(base, columns) for base in ("__dbml_n", "__dbml_r", "__dbml_i"))
    sub = lambda q, alias: exp.Subquery(this=q, alias=exp.TableAlias(this=exp.to_identifier(alias)))  # noqa: E731
    counted = exp.select(exp.Star(), exp.alias_(exp.Window(this=exp.func("count", exp.Star()), partition_by=[lab],
                                                           over="OVER"), n, quoted=True)).from_(sub(query, "__dbml_q"))
    reps = exp.func("greatest", exp.Literal.number(1), exp.cast(exp.func("round", exp.Div(
        this=exp.Window(this=exp.func("max", column(n)), over="OVER"), expression=column(n))),
        "BIGINT"))
    if copies is not None:
        reps = exp.Case(ifs=[exp.If(this=exp.EQ(this=exp.cast(lab.copy(), "VARCHAR"), expression=exp.Literal.string(k)),
                                    true=exp.Literal.number(v)) for k, v in copies.items() if k is not None],
                        default=exp.Literal.number(copies[None]))
    weighted = exp.select(exp.Star(), exp.alias_(reps, r, quoted=True)).from_(sub(counted, "__dbml_c"))
    repeats = exp.Table(this=exp.func("range", column(r)),
                        alias=exp.TableAlias(this=exp.to_identifier("__dbml_k"), columns=[exp.to_identifier(i, quoted=True)]))
    return exp.select(star_except(n, r, i)).from_(sub(weighted, "__dbml_w")).join(
        repeats, join_type="CROSS")


def temporal_as_numbers(con, query: exp.Select) -> exp.Select:
    """DATE/TIMESTAMP/TIME columns as seconds since the epoch (BigQuery ML takes them as features)."""
    rel = con.sql(query.sql("duckdb"))
    temporal = [n for n, t in zip(rel.columns, rel.types) if str(t).split(" ")[0] in ("DATE", "TIMESTAMP", "TIME", "TIMESTAMP_NS", "TIMESTAMP_MS", "TIMESTAMP_S") or str(t).startswith("TIMESTAMP")]
    if not temporal:
        return query
    star = exp.Star(replace=[exp.alias_(exp.func("epoch", exp.column(n, quoted=True)), n, quoted=True) for n in temporal])
    return exp.select(star).from_(exp.Subquery(this=query, alias=exp.TableAlias(this=exp.to_identifier("__dbml_t"))))


def check_regressed_label(con, name: str, kind: str, source: exp.Select, label: str) -> None:
    """A regression model_type's label must be numeric; a text label names classes, which
    BigQuery's classifier model_type of the same family predicts (train()'s own message
    would name its task argument, which BigQuery's syntax has not)."""
    from ..core.source import Column
    columns = {c.name: c for c in (Column(n, str(t)) for n, t in zip(*_columns(con, source)))}
    column = columns.get(label)
    if column is None or column.is_numeric:
        return   # a missing label is train()'s to name
    classifier = "logistic_reg" if kind == "linear_reg" else kind.replace("_regressor", "_classifier")
    raise InvalidArgument(f"BigQuery ML: CREATE MODEL {name}: model_type {kind} predicts a number, and the label "
                          f"column {label} is {column.type}; for its classes use model_type = '{classifier}', "
                          f"or CAST the label to a number in the AS query")


def _columns(con, query: exp.Select) -> tuple[list[str], list]:
    rel = con.sql(query.sql("duckdb"))
    return rel.columns, rel.types


def train_statement(name: str, source: str, args: dict) -> exp.Select:
    """``SELECT train(name, source, k := v, ...)``, each value cast to its parameter's SQL type
    (``train``'s, from ``TRAIN_PARAMS``): BigQuery's ``0.1`` is a DECIMAL to DuckDB, and
    ``max_iterations = 10.0`` must reach ``epochs INTEGER``."""
    types = {p.name: p.sql_type for p in TRAIN_PARAMS}
    unknown = [k for k in args if k not in types]
    if unknown:
        raise AssertionError(f"BigQuery ML: train() has no parameter {unknown[0]} (create.py maps an option to it)")
    return exp.select(exp.func("train", exp.Literal.string(name), exp.Literal.string(source),
                               *[exp.Kwarg(this=exp.var(k), expression=exp.cast(_value(v), types[k], dialect="duckdb"))
                                 for k, v in args.items()]))


def check_runs(con, name: str, runs: list[tuple[dict, dict | None]], trials: bool = True) -> None:
    """Every trial's ``train`` arguments checked by train()'s own rules (``spec.from_sql_row``, on
    the values DuckDB casts them to, as ``train_statement`` passes them) before the first trains:
    CREATE MODEL stores all its trials or nothing (a later trial refused left the earlier ones
    stored, with no BigQuery ML record). ``trials``: the runs are the trials, in order; else
    points of a Bayesian search's space (``tuning.Search.checked``), named as such."""
    types = {p.name: p.sql_type for p in TRAIN_PARAMS}
    for trial, (args, hyperparameters) in enumerate(runs, 1):
        which = ("its options" if not hyperparameters else f"trial {trial} ({json.dumps(hyperparameters)})" if trials
                 else f"{json.dumps(hyperparameters)}, a point of its search space")
        casts = exp.select(*[exp.cast(_value(v), types[k], dialect="duckdb").as_(k) for k, v in args.items()])
        try:
            values = dict(zip(args, con.execute(casts.sql("duckdb")).fetchall()[0]))
            row = tuple(values.get(p.name, p.default) for p in TRAIN_PARAMS)
            from_sql_row((name, "",) + row[2:] + (None,) * len(SETTINGS))
        except (InvalidArgument, duckdb.Error) as e:
            fix = ("; keep the option's HPARAM_RANGE or HPARAM_CANDIDATES to values train() takes"
                   if hyperparameters else "")
            why = str(e).splitlines()[0]   # DuckDB's cast error, without the statement it quotes
            raise InvalidArgument(f"BigQuery ML: CREATE MODEL {name}: train() refuses {which}: {why}{fix}; "
                                  f"nothing was trained") from None


MAX_TRIALS = 1000   # num_trials: BigQuery ML's own limit is lower for most models; each trial trains a model


def plan(con, tree: exp.Create) -> dict:
    """Everything CREATE MODEL will do, checked before anything trains: the ``train`` arguments,
    the source it trains on (TRANSFORM applied), and what the store keeps (the queries before
    TRANSFORM, which the model functions apply as to any input)."""
    name = model_name(tree.this)
    if tree.expression is None:
        raise InvalidArgument(f"BigQuery ML: CREATE MODEL {name}: needs AS <query> (the training data); dbml trains "
                              f"only from a query")
    options, transform = given_options(tree)
    # nothing of the user's runs before this: the query and the TRANSFORM only read
    where = "BigQuery ML: CREATE MODEL " + name   # the messages' subject
    refuse_effects(tree.expression, where=where, arg="its query")
    for e in transform or ():
        refuse_effects(e, where=where, arg="TRANSFORM")
        if e.find(exp.Query) is not None:
            raise InvalidArgument(f"{where}: TRANSFORM's {e.sql('bigquery')[:60]} holds a subquery; TRANSFORM computes "
                                  f"each row from its own columns (and the query's statistics): join what it needs "
                                  f"in the AS query instead")
    kind, arch, task = model_kind(name, options)
    check_options(name, kind, arch, options)
    if arch in TREES and importlib.util.find_spec("lightgbm") is None:
        raise InvalidArgument(f"BigQuery ML: CREATE MODEL {name}: model_type {kind} needs LightGBM, which is not "
                              f"installed; pip install 'dbml[trees]'")
    trials = options.get("num_trials")
    trials = 0 if trials is None else count(trials, "CREATE MODEL " + name + ": num_trials", 1, MAX_TRIALS)
    given = tuning.given_spaces(options)
    if given and not trials:
        raise InvalidArgument(f"BigQuery ML: CREATE MODEL {name}: HPARAM_RANGE and HPARAM_CANDIDATES need "
                              f"num_trials = <number of trials>")
    objective = tuning.objective(options, task, name)
    spaces = (given or tuning.DEFAULT_SPACES[arch]) if trials else {}
    algorithm = tuning.algorithm(options, spaces, name)
    maximize = tuning.OBJECTIVES[task][objective] if objective is not None else True
    search = tuning.Search(spaces, trials, algorithm, not given, maximize) if trials else None
    query = names.to_duckdb(con, tree.expression.copy())
    split_args = split(name, options, arch)
    check_split_col(con, name, query, split_args)

    def arguments(point: dict | None) -> dict:
        """A trial's ``train`` arguments: the options with the trial's point."""
        return {**train_arguments(name, kind, arch, task, {**options, **(point or {})}), **split_args}

    # every trial's arguments (a Bayesian search's: its space's ends) checked before any trains
    runs = [(arguments(point), point) for point in search.planned] if search else [(arguments(None), None)]
    if search is None or search.checked is search.planned:
        check_runs(con, name, runs)
    else:
        check_runs(con, name, [(arguments(point), point) for point in search.checked], trials=False)
    args = runs[0][0]
    frozen = None
    source = query
    if transform is not None:
        frozen = preprocess.freeze(con, [names.to_duckdb(con, e, live=False) for e in transform],
                                   query.sql("duckdb"))
        for e in frozen:
            if not e.alias_or_name:
                raise InvalidArgument(f"BigQuery ML: CREATE MODEL {name}: TRANSFORM's {e.sql('bigquery')[:60]} "
                                      f"needs AS <name>")
        # the column train() splits by, beside TRANSFORM's
        by = split_args.get("split_col")
        kept = [column(by)] if by and by not in {e.alias_or_name for e in frozen} else []
        source = apply_transform(query, [*frozen, *kept])
    if arch == "kmeans":
        source = exp.select(exp.Star(), exp.alias_(exp.Literal.number(0.0), NO_LABEL)).from_(
            exp.Subquery(this=source, alias=exp.TableAlias(this=exp.to_identifier("__dbml_k"))))
    source = temporal_as_numbers(con, source)
    if task == "regression" and arch != "kmeans":
        check_regressed_label(con, name, kind, source, args["label"])
    if options.get("class_weights") is not None and options.get("auto_class_weights"):
        raise InvalidArgument(f"BigQuery ML: CREATE MODEL {name}: pass auto_class_weights or class_weights, "
                              f"not both")
    if options.get("class_weights") is not None:
        source = class_weighted(source, args["label"], con.sql(source.sql("duckdb")).columns,
                                class_copies(name, options["class_weights"]))
    elif options.get("auto_class_weights") and arch in TORCH:
        source = class_weighted(source, args["label"], con.sql(source.sql("duckdb")).columns)
    return {"name": name, "kind": kind, "args": args, "source": source.sql("duckdb"), "query": query.sql("duckdb"),
            "held_out": None,   # train() holds the rows out (a store of old kept SEQ's and CUSTOM's query)
            "transform": None if frozen is None else [e.sql("duckdb") for e in frozen],
            "runs": runs, "trials": trials, "options": options, "objective": objective,
            "search": search, "arguments": arguments}


def apply_transform(query: exp.Expression, frozen: list) -> exp.Select:
    return exp.select(*[e.copy() for e in frozen]).from_(
        exp.Subquery(this=query, alias=exp.TableAlias(this=exp.to_identifier("__dbml_in"))))
