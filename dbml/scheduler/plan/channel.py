"""The copy channel: busy intervals of host <-> device copies, disjoint and sorted.

Swap planning (swap.py) asks it where a copy fits; only the planner's commits
(state.py) add or remove intervals. Jobs share one channel when
``PlanSettings.shared_channel`` is set, else each job has its own.

>>> c = Channel()
>>> c.add(1.0, 2.0)
>>> c.earliest(0.5, 10.0, 1.0), c.latest(0.0, 2.5, 1.0)
(2.0, 0.0)
"""

from __future__ import annotations

import bisect

from ..errors import PlanningError

TOL = 1e-12   # seconds: float rounding between equal event times


class Channel:
    """Busy intervals of one copy channel, disjoint and sorted."""

    def __init__(self) -> None:
        self.starts: list[float] = []
        self.ends: list[float] = []

    def fits(self, start: float, end: float) -> bool:
        """Free for [start, end), up to float rounding of re-derived event times."""
        i = bisect.bisect_left(self.starts, start)
        return not ((i > 0 and self.ends[i - 1] > start + TOL) or
                    (i < len(self.starts) and self.starts[i] < end - TOL))

    def add(self, start: float, end: float) -> None:
        if not self.fits(start, end):
            raise PlanningError(f"copy [{start}, {end}) overlaps the channel's busy intervals")
        i = bisect.bisect_left(self.starts, start)
        self.starts.insert(i, start)
        self.ends.insert(i, end)

    def remove(self, start: float, end: float) -> None:
        i = bisect.bisect_left(self.starts, start)
        if i == len(self.starts) or self.starts[i] != start or self.ends[i] != end:
            raise PlanningError(f"copy [{start}, {end}) is not on the channel")
        del self.starts[i], self.ends[i]

    def replace(self, copies: list[tuple[float, float]]) -> None:
        """Hold exactly these copies (sorted, disjoint: a job's own channel after a rebuild)."""
        self.starts, self.ends = [c[0] for c in copies], [c[1] for c in copies]

    def earliest(self, lo: float, hi: float, d: float) -> float | None:
        """Earliest x >= lo with [x, x + d) free and x + d <= hi."""
        x = lo
        i = max(bisect.bisect_right(self.starts, lo) - 1, 0)
        while i < len(self.starts) and self.starts[i] < x + d:
            x = max(x, self.ends[i])
            i += 1
        return x if x + d <= hi else None

    def latest(self, lo: float, hi: float, d: float) -> float | None:
        """Latest x >= lo with [x, x + d) free and x + d <= hi."""
        x = hi - d
        j = bisect.bisect_left(self.starts, hi) - 1
        while j >= 0 and self.ends[j] > x:
            x = min(x, self.starts[j] - d)
            j -= 1
        return x if x >= lo else None
