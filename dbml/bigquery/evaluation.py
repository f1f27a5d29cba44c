"""BigQuery ML's evaluation figures (``ML.EVALUATE``, ``ML.ROC_CURVE``), weights and feature
statistics, in numpy, as BigQuery documents them.

Classifiers: ``precision``, ``recall``, ``f1_score`` of the positive class (the second class
in sorted order) for binary models, macro averages over the classes otherwise; ``accuracy``;
``log_loss``; ``roc_auc`` (binary: of the positive class's probability; multiclass: the
mean one-vs-rest AUC). Regressors: ``mean_absolute_error``, ``mean_squared_error``,
``mean_squared_log_error`` (NULL if a value is below -1), ``median_absolute_error``,
``r2_score``, ``explained_variance``. k-means: ``davies_bouldin_index``, ``mean_squared_distance``.
"""

from __future__ import annotations

import numpy as np


def _auc(y: np.ndarray, score: np.ndarray) -> float | None:
    """Area under the ROC curve by ranks (ties averaged), as scikit-learn's roc_auc_score."""
    pos, neg = int(np.sum(y)), int(len(y) - np.sum(y))
    if pos == 0 or neg == 0:
        return None
    order = np.argsort(score, kind="mergesort")
    ranks = np.empty(len(score))
    sorted_scores = score[order]
    i = 0
    while i < len(score):
        j = i
        while j + 1 < len(score) and sorted_scores[j + 1] == sorted_scores[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2 + 1
        i = j + 1
    return float((ranks[y == 1].sum() - pos * (pos + 1) / 2) / (pos * neg))


def _prf(y: np.ndarray, pred: np.ndarray, c: int) -> tuple[float, float, float]:
    tp = np.sum((pred == c) & (y == c))
    fp, fn = np.sum((pred == c) & (y != c)), np.sum((pred != c) & (y == c))
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / (tp + fn) if tp + fn else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return float(precision), float(recall), float(f1)


def classification(y: np.ndarray, prob: np.ndarray, pred: np.ndarray) -> dict:
    y = y.astype(np.int64)
    k = prob.shape[1]
    if k == 2:
        precision, recall, f1 = _prf(y, pred, 1)
        auc = _auc((y == 1).astype(int), prob[:, 1])
    else:
        per = [_prf(y, pred, c) for c in range(k)]
        precision, recall, f1 = (float(np.mean([p[i] for p in per])) for i in range(3))
        aucs = [a for a in (_auc((y == c).astype(int), prob[:, c]) for c in range(k)) if a is not None]
        auc = float(np.mean(aucs)) if aucs else None
    p_true = np.where(y >= 0, prob[np.arange(len(y)), np.clip(y, 0, None)], 0.0)
    log_loss = float(-np.mean(np.log(np.clip(p_true, 1e-15, 1.0))))
    return {"precision": precision, "recall": recall, "accuracy": float(np.mean(pred == y)), "f1_score": f1,
            "log_loss": log_loss, "roc_auc": auc}


def regression(y: np.ndarray, pred: np.ndarray) -> dict:
    y, pred = y.astype(np.float64), pred.astype(np.float64)
    err = pred - y
    ss_tot = float(np.sum((y - y.mean()) ** 2))
    msle = float(np.mean((np.log1p(pred) - np.log1p(y)) ** 2)) if (y > -1).all() and (pred > -1).all() else None
    return {"mean_absolute_error": float(np.mean(np.abs(err))), "mean_squared_error": float(np.mean(err ** 2)),
            "mean_squared_log_error": msle, "median_absolute_error": float(np.median(np.abs(err))),
            "r2_score": 1 - float(np.sum(err ** 2)) / ss_tot if ss_tot else None,
            "explained_variance": 1 - float(np.var(y - pred)) / float(np.var(y)) if np.var(y) else None}


def roc_curve(y: np.ndarray, score: np.ndarray, thresholds=None) -> list[dict]:
    if thresholds is None:   # BigQuery: about a hundred thresholds at the scores' percentiles
        thresholds = sorted(set(np.quantile(score, np.linspace(0, 1, 101)).round(6).tolist()), reverse=True)
    out = []
    for t in thresholds:
        pred = score >= t
        tp, fp = int(np.sum(pred & (y == 1))), int(np.sum(pred & (y == 0)))
        fn, tn = int(np.sum(~pred & (y == 1))), int(np.sum(~pred & (y == 0)))
        out.append({"threshold": float(t), "recall": tp / (tp + fn) if tp + fn else 0.0,
                    "false_positive_rate": fp / (fp + tn) if fp + tn else 0.0, "true_positives": tp,
                    "false_positives": fp, "true_negatives": tn, "false_negatives": fn})
    return out


def clustering(dist: np.ndarray, between: np.ndarray) -> dict:
    """Davies-Bouldin index and mean squared distance to the nearest centroid, from each row's
    distance to every centroid (``dist``) and the centroids' distances to each other
    (``between``), in the model's distance: the mean over clusters of the largest
    (scatter_i + scatter_j) / distance_ij, a cluster's scatter being its rows' mean distance
    to its centroid (scikit-learn's davies_bouldin_score, for euclidean distance). Clusters
    no row falls in are left out; NULL with fewer than two."""
    nearest = dist.argmin(1)
    used = [c for c in range(dist.shape[1]) if (nearest == c).any()]
    scatter = {c: float(dist[nearest == c, c].mean()) for c in used}
    index = None
    if len(used) >= 2:
        ratios = [max((scatter[i] + scatter[j]) / between[i, j] if between[i, j] > 0 else np.inf
                      for j in used if j != i) for i in used]
        index = float(np.mean(ratios))
    return {"davies_bouldin_index": index, "mean_squared_distance": float(np.mean(dist.min(1) ** 2)) if len(dist) else None}


def weights(model, standardize: bool) -> list[dict]:
    """ML.WEIGHTS of a linear model: one row per input column and ``__INTERCEPT__``; categories'
    weights in ``category_weights``. Binary classifiers: the positive class's log-odds.
    ``standardize``: the weights of the standardised numeric columns (dbml's own inputs), else
    per unit of the column (and the intercept at zero rather than at the columns' means)."""
    from ..errors import InvalidArgument
    from ..explain import linear_layer
    linear = linear_layer(model.stored.module)
    if linear is None:
        raise InvalidArgument(f"BigQuery ML: ML.WEIGHTS is for linear and logistic regression models; {model.name} "
                              f"is {model.stored.config.arch} (use ML.GLOBAL_EXPLAIN)")
    w = linear.weight.detach().double().numpy()
    b = linear.bias.detach().double().numpy()
    prep = model.prep
    if prep.task == "classification":
        if len(prep.classes) != 2:
            raise InvalidArgument(f"BigQuery ML: ML.WEIGHTS of a multiclass model is not supported in dbml "
                                  f"({model.name} has {len(prep.classes)} classes); use ML.GLOBAL_EXPLAIN")
        w, b = w[1] - w[0], b[1] - b[0]
    else:
        w, b = w[0] * prep.target_std, b[0] * prep.target_std + prep.target_mean
    out, start, intercept = [], 0, float(b)
    for f in prep.features:
        part = w[start:start + f.width]
        if f.kind == "numeric":
            weight = float(part[0]) if standardize else float(part[0] / f.std)
            if not standardize:
                intercept -= float(part[0]) * f.mean / f.std
            out.append({"processed_input": f.name, "weight": weight, "category_weights": []})
        elif f.kind == "categorical":
            out.append({"processed_input": f.name, "weight": None,
                        "category_weights": [{"category": str(c), "weight": float(v)}
                                             for c, v in zip(f.categories, part)]})
        else:
            raise InvalidArgument(f"BigQuery ML: ML.WEIGHTS: {f.name} is an array column, which dbml's ML.WEIGHTS "
                                  f"does not report; use ML.GLOBAL_EXPLAIN")
        start += f.width
    out.append({"processed_input": "__INTERCEPT__", "weight": intercept, "category_weights": []})
    return out


def feature_info(con, model, query) -> list[dict]:
    """Per input column of the training query (``query``, TRANSFORM applied): min, max, mean,
    median, stddev, category_count, null_count, dimension."""
    from sqlglot import exp
    out = []
    for f in model.prep.features:
        c = exp.column(f.name, quoted=True)
        numeric = f.kind == "numeric"
        aggs = [exp.func("min", c.copy()), exp.func("max", c.copy()), exp.func("avg", c.copy()),
                exp.func("median", c.copy()), exp.func("stddev_samp", c.copy())] if numeric else []
        aggs += [exp.func("count", exp.Distinct(expressions=[c.copy()])),
                 exp.Sub(this=exp.func("count", exp.Star()), expression=exp.func("count", c.copy()))]
        row = con.execute(exp.select(*aggs).from_(exp.Subquery(this=query.copy(), alias=exp.TableAlias(
            this=exp.to_identifier("src")))).sql("duckdb")).fetchall()[0]
        stats = list(row[:5]) if numeric else [None] * 5
        out.append({"input": f.name, "min": _f(stats[0]), "max": _f(stats[1]), "mean": _f(stats[2]),
                    "median": _f(stats[3]), "stddev": _f(stats[4]),
                    "category_count": None if numeric else int(row[-2]), "null_count": int(row[-1]),
                    "dimension": f.width if f.kind == "array" else None})
    return out


def _f(v):
    return None if v is None else float(v)
