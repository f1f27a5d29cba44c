"""train()'s model arguments checked as far as no data is needed (``arguments``): one owner,
which ``models.config`` and ``TrainSpec`` both call, so a train() argument or a value a
tune() space may draw is refused before any job starts. torch-free: the zoo (which imports
torch) is imported only where an arch's options are checked, so a train() with the default
arch that fails its checks never imports torch."""

from __future__ import annotations

from ..errors import InvalidArgument


def arguments(arch: str, options: dict | None, *, hidden=None, dropout: float | None = None,
              fn: str = "train") -> dict:
    """The arch's options with the older ``hidden`` and ``dropout`` arguments merged in (options
    of 'mlp', and 'dropout' of most archs), checked as far as no data is needed: hidden's sizes,
    dropout's range and, for a named arch (not 'auto'), each option's type and range
    (``zoo.checked_options``). ``config`` and ``TrainSpec`` both check with it, so a train()
    argument, or a value a tune() space may draw, is refused before any job starts."""
    options = dict(options or {})
    if arch == "auto":   # the arch is known once the data is; a list of hidden sizes is mlp's option
        _layers(options.get("hidden", hidden), fn)
        _dropout(options.get("dropout", dropout), fn)
        if hidden is not None:
            from ..zoo import arch as zoo_arch, checked_options   # the zoo imports torch: only for an arch checked
            checked_options(zoo_arch(HIDDEN_ARCH), {"hidden": list(hidden)}, fn=fn)
        return options
    from ..zoo import arch as zoo_arch, checked_options
    a = zoo_arch(arch, fn=fn)
    for key, value in (("hidden", hidden), ("dropout", dropout)):
        if value is None or key in options:
            continue
        if key not in a.options:
            if key == "dropout" and value == 0.0:
                continue
            fix = f"pass arch := '{HIDDEN_ARCH}'" if key == "hidden" else f"drop {key} :="
            raise InvalidArgument(f"{fn}(): arch {arch!r} has no {key}; {fix} (its options: "
                                  f"{', '.join(a.options) or 'none'})")
        options[key] = list(value) if key == "hidden" else value
    _layers(options.get("hidden"), fn)
    _dropout(options.get("dropout"), fn)
    checked_options(a, options, fn=fn)
    return options


# the arch whose option the hidden := [...] argument is
HIDDEN_ARCH = "mlp"


def _layers(hidden, fn: str) -> None:
    if isinstance(hidden, (list, tuple)) and (not hidden or any(
            not isinstance(h, (int, float)) or isinstance(h, bool) or h is None or h <= 0 for h in hidden)):
        raise InvalidArgument(f"{fn}(): hidden must list positive layer sizes, e.g. hidden := [64, 64]")


def _dropout(dropout, fn: str) -> None:
    if dropout is not None and not (isinstance(dropout, (int, float)) and 0.0 <= float(dropout) < 1.0):
        raise InvalidArgument(f"{fn}(): dropout must be in [0, 1), e.g. dropout := 0.1")


