"""BigQuery ML's preprocessing functions (``ML.STANDARD_SCALER(x) OVER ()``, ``ML.BUCKETIZE``, ...)
as DuckDB expressions.

Each analytic function is two parts: its statistics (aggregates over the column) and how a
value is mapped with them. In a plain query the statistics are window aggregates (``live``);
in a model's ``TRANSFORM`` they are computed once over the training query and written into
the expressions as constants (``freeze``), which the model keeps and applies at prediction,
as BigQuery does.
"""

from __future__ import annotations

import math

from sqlglot import exp

from ..errors import InvalidArgument


def _f(name: str, *args) -> exp.Expression:
    return exp.func(name, *args, dialect="duckdb")


def _num(v) -> exp.Expression:
    if v is None:
        return exp.Null()
    if isinstance(v, (list, tuple)):
        return exp.Array(expressions=[_num(x) for x in v])
    if isinstance(v, str):
        return exp.Literal.string(v)
    if isinstance(v, bool) or not math.isfinite(float(v)):
        raise InvalidArgument(f"BigQuery ML: a TRANSFORM statistic is {v!r}, not a finite number")
    n = exp.Literal.number(repr(abs(float(v))))
    return exp.Neg(this=n) if float(v) < 0 else n


def _bins(x: exp.Expression, bounds: list[exp.Expression]) -> exp.Expression:
    """'bin_<1 + number of bounds <= x>', NULL for NULL (BigQuery's bucket names)."""
    count: exp.Expression = exp.Literal.number(1)
    for b in bounds:
        count = exp.Add(this=count, expression=exp.cast(exp.GTE(this=x.copy(), expression=b), "INTEGER"))
    return exp.DPipe(this=exp.Literal.string("bin_"), expression=exp.cast(count, "VARCHAR"))


def _arg(args, i, default=None):
    return args[i] if len(args) > i else default


def _const(node, what):
    from .parse import constant
    return constant(node, what)


# name -> (statistics of x, mapping of x with the statistics)
ANALYTIC = {
    "STANDARD_SCALER": (lambda x, a: [_f("avg", x), _f("stddev_samp", x)],
                        lambda x, a, s: exp.Div(this=exp.Paren(this=exp.Sub(this=x, expression=s[0])),
                                                expression=_f("nullif", s[1], exp.Literal.number(0)))),
    "MIN_MAX_SCALER": (lambda x, a: [_f("min", x), _f("max", x)],
                       lambda x, a, s: _f("greatest", exp.Literal.number(0), _f("least", exp.Literal.number(1),
                           exp.Div(this=exp.Paren(this=exp.Sub(this=x, expression=s[0])),
                                   expression=_f("nullif", exp.Paren(this=exp.Sub(this=s[1], expression=s[0].copy())),
                                                 exp.Literal.number(0)))))),
    "MAX_ABS_SCALER": (lambda x, a: [_f("max", _f("abs", x))],
                       lambda x, a, s: exp.Div(this=x, expression=_f("nullif", s[0], exp.Literal.number(0)))),
    "ROBUST_SCALER": (lambda x, a: [_f("quantile_cont", x, _num([0.25, 0.5, 0.75]))],
                      lambda x, a, s: exp.Div(this=exp.Paren(this=exp.Sub(this=x, expression=exp.Bracket(
                          this=s[0], expressions=[exp.Literal.number(2)]))), expression=_f("nullif", exp.Paren(
                              this=exp.Sub(this=exp.Bracket(this=s[0].copy(), expressions=[exp.Literal.number(3)]),
                                           expression=exp.Bracket(this=s[0].copy(), expressions=[exp.Literal.number(1)]))),
                              exp.Literal.number(0)))),
    "IMPUTER": (lambda x, a: [{"mean": _f("avg", x), "median": _f("median", x),
                               "most_frequent": _f("mode", x)}[str(_const(_arg(a, 1), "ML.IMPUTER strategy")).lower()]],
                lambda x, a, s: _f("coalesce", x, s[0])),
    "QUANTILE_BUCKETIZE": (lambda x, a: [_f("quantile_cont", x, _num(
                               [i / _buckets(a) for i in range(1, _buckets(a))]))],
                           lambda x, a, s: _bins(x, [exp.Bracket(this=s[0].copy(), expressions=[exp.Literal.number(i)])
                                                     for i in range(1, _buckets(a))])),
}


MAX_BUCKETS = 10_000        # ML.QUANTILE_BUCKETIZE's buckets: each is a quantile DuckDB computes
MAX_FIELDS = 100            # POLYNOMIAL_EXPAND / FEATURE_CROSS: the terms grow as the fields' square


def _buckets(args) -> int:
    from .parse import count
    return count(_const(_arg(args, 1), "ML.QUANTILE_BUCKETIZE buckets"), "ML.QUANTILE_BUCKETIZE's buckets",
                 1, MAX_BUCKETS)


def _bucketize(x, args):
    splits = _const(args[1], "ML.BUCKETIZE split points")
    if _arg(args, 2) is not None and _const(args[2], "ML.BUCKETIZE exclude_boundaries"):
        splits = splits[1:-1]
    return _bins(x, [_num(s) for s in splits])


def _fields(args, fn):
    struct = args[0] if args else None
    if not isinstance(struct, exp.Struct):
        raise InvalidArgument(f"BigQuery ML: ML.{fn} takes a STRUCT of columns")
    out = []
    for item in struct.expressions:
        if isinstance(item, exp.PropertyEQ):
            out.append((item.name, item.expression))
        elif isinstance(item, exp.Alias):
            out.append((item.alias, item.this))
        else:
            out.append((item.alias_or_name, item))
    if len(out) > MAX_FIELDS:
        raise InvalidArgument(f"BigQuery ML: ML.{fn} takes at most {MAX_FIELDS} fields (its terms grow as their "
                              f"square), got {len(out)}")
    return out


def _feature_cross(x, args):
    """The crosses of the struct's fields, two at a time ('a_b' values); one pair: that string."""
    fields = _fields(args, "FEATURE_CROSS")
    pairs = [(a, b) for i, a in enumerate(fields) for b in fields[i + 1:]]
    values = [exp.DPipe(this=exp.DPipe(this=exp.cast(a[1].copy(), "VARCHAR"), expression=exp.Literal.string("_")),
                        expression=exp.cast(b[1].copy(), "VARCHAR")) for a, b in pairs]
    if len(values) == 1:
        return values[0]
    return exp.Struct(expressions=[exp.PropertyEQ(this=exp.to_identifier(f"{a[0]}_{b[0]}"), expression=v)
                                   for (a, b), v in zip(pairs, values)])


def _polynomial_expand(x, args):
    fields = _fields(args, "POLYNOMIAL_EXPAND")
    items = [(n, v) for n, v in fields]
    items += [(f"{a[0]}_{b[0]}", exp.Mul(this=a[1].copy(), expression=b[1].copy()))
              for i, a in enumerate(fields) for b in fields[i:]]
    return exp.Struct(expressions=[exp.PropertyEQ(this=exp.to_identifier(n), expression=v) for n, v in items])


SCALAR = {"BUCKETIZE": _bucketize, "FEATURE_CROSS": _feature_cross, "POLYNOMIAL_EXPAND": _polynomial_expand}


def _ml_call(node) -> tuple[str, list] | None:
    if isinstance(node, exp.Dot) and isinstance(node.this, exp.Identifier) and node.this.name.upper() == "ML" \
            and isinstance(node.expression, exp.Anonymous):
        return node.expression.name.upper(), list(node.expression.expressions)
    return None


def _rewrite(node, stats_for):
    if isinstance(node, exp.Window):
        call = _ml_call(node.this)
        if call and call[0] in ANALYTIC:
            name, args = call
            stats, apply = ANALYTIC[name]
            return apply(args[0].copy(), args, stats_for(stats(args[0].copy(), args)))
    call = _ml_call(node)
    if call:
        name, args = call
        if name in SCALAR:
            return SCALAR[name](args[0] if args else None, args)
        if name in ANALYTIC:
            raise InvalidArgument(f"BigQuery ML: ML.{name} is an analytic function: write ML.{name}(...) OVER ()")
        raise InvalidArgument(f"BigQuery ML: the function ML.{name} is not supported in dbml")
    return node


def live(tree: exp.Expression) -> exp.Expression:
    """Every ML preprocessing call in ``tree`` as DuckDB SQL, statistics as window aggregates."""
    over = lambda stats: [exp.Window(this=s, over="OVER") for s in stats]   # noqa: E731
    return tree.transform(lambda node: _rewrite(node, over))


def freeze(con, expressions: list, source_sql: str) -> list:
    """TRANSFORM's expressions with their statistics computed over ``source_sql`` and written
    in as constants."""
    wanted: list[exp.Expression] = []
    for e in expressions:
        e.copy().transform(lambda node: _rewrite(node, lambda stats: wanted.extend(stats) or stats))
    values = []
    if wanted:
        query = exp.select(*[exp.alias_(s, f"s{i}") for i, s in enumerate(wanted)]).from_(
            exp.Subquery(this=exp.maybe_parse(source_sql, dialect="duckdb"), alias=exp.TableAlias(this=exp.to_identifier("src"))))
        values = list(con.execute(query.sql("duckdb")).fetchall()[0])
    it = iter(values)
    return [e.copy().transform(lambda node: _rewrite(node, lambda stats: [_num(next(it)) for _ in stats]))
            for e in expressions]
