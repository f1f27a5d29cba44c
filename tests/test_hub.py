"""The hub spreads worker reports as more worker processes report (issue 33, part 2: the
hub was the first limit at 3,072 running jobs; ``dbml.cluster.hub.REPORTS_PER_S``). Plain
Python: the Hub class without Ray (benchmarks/sim_cluster.py measures the actor)."""

from __future__ import annotations

from dbml.cluster import hub as hub_module
from dbml.cluster.hub import REPORTS_PER_S, Hub


def report(hub: Hub, reporter: str, every: float = 0.2) -> dict:
    return hub.report_many({f"{reporter}:job": {"steps": [1]}}, reporter, every)


def test_few_reporters_keep_their_interval_and_get_their_answers():
    hub = Hub()
    hub.cancel("w0:job", "stop")
    for i in range(10):
        answer = report(hub, f"w{i}")
        assert answer["next_s"] == 0.2
    assert report(hub, "w0")["answers"] == {"w0:job": {"cancel": "stop", "verdicts": {}}}
    assert set(hub.poll_all()) == {f"w{i}:job" for i in range(10)}


def test_many_reporters_are_spread_to_the_hub_rate_and_the_gone_stop_counting(monkeypatch):
    hub, now = Hub(), [1000.0]
    monkeypatch.setattr(hub_module.time, "monotonic", lambda: now[0])
    n = 1000
    answers = [report(hub, f"w{i}") for i in range(n)]
    assert answers[-1]["next_s"] == n / REPORTS_PER_S   # 4 s: the hub takes 250 reports/s, whatever the jobs
    assert answers[10]["next_s"] == 0.2                 # while few had reported
    now[0] += 60.0                                      # all of them gone (finished, or dead)
    assert report(hub, "late")["next_s"] == 0.2
