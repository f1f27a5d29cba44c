"""The issue-13 goals judged from a run's rows (dbml.bench.goals): met, missed, not measured."""

from dbml.bench import goals, report


def _row(method, msr, eor, peak, family="dbml", mode="cpu", workload="resnet50", **extra):
    return {"section": "single", "mode": mode, "workload": workload, "family": family, "method": method,
            "msr": msr, "eor": eor, "peak_bytes": peak, "bit_identical": True, "within_budget": True,
            "error": None, **extra}


def test_memory_at_overhead_takes_the_best_memory_within_the_overhead():
    rows = [_row("dbml-tensile@75%", 0.25, 1.02, 75), _row("dbml-tensile@50%", 0.5, 1.12, 50),
            _row("dbml-tensile@35%", 0.65, 1.4, 35)]
    [g] = goals.memory_at_overhead(rows, ["resnet50"], 0.5, 1.15)
    assert g.met and "0.500 at EOR 1.120" in g.figure
    [g] = goals.memory_at_overhead(rows, ["resnet50"], 0.65, 1.3)
    assert g.met is False


def test_a_row_that_differs_from_eager_or_breaks_its_budget_does_not_count():
    rows = [_row("dbml-tensile@50%", 0.5, 1.1, 50, bit_identical=False),
            _row("dbml-tensile@35%", 0.65, 1.1, 35, within_budget=False)]
    [g] = goals.memory_at_overhead(rows, ["resnet50"], 0.5, 1.15)
    assert g.met is None and g.figure == "no dbml row"


def test_the_frontier_must_use_no_more_memory_and_no_more_time_than_each_peer():
    rows = [_row("checkpoint", 0.1, 1.6, 90, family="peer"), _row("offload", 0.15, 1.05, 85, family="peer"),
            _row("dbml-tensile@75%", 0.25, 1.1, 75)]
    by_peer = {g.goal: g.met for g in goals.frontier_dominates(rows, ["resnet50"])}
    assert by_peer == {"frontier dominates checkpoint": True, "frontier dominates offload": False}


def test_smallest_budget_is_judged_against_the_planning_rows_floor():
    rows = [{"section": "planning", "workload": "resnet50", "floor_bytes": 100},
            _row("dbml-tensile@min", 0.6, 1.5, 110, smallest_feasible_bytes=114, latency_model="roofline"),
            _row("dbml-tensile@35%", None, None, None, workload="vgg16", error="InfeasibleBudget")]
    got = goals.smallest_budget(rows, ["resnet50", "densenet121"])
    assert [(g.workload, g.met) for g in got] == [("resnet50", True), ("densenet121", None), ("vgg16", False)]


def test_emulated_cbr_is_compared_with_the_papers_table():
    rows = [_row("dbml-tensile@50%", 0.5, 1.5, 50, mode="emulated:a6000", cbr=0.33)]
    got = {g.workload: g.met for g in goals.emulated(rows) if g.goal.startswith("CBR")}
    assert got["resnet50"] is True and got["vgg16"] is None


def test_the_report_says_how_many_goals_were_met():
    rows = [_row("dbml-tensile@50%", 0.5, 1.1, 50), _row("dbml-none", 0.0, 1.2, 100)]
    text = report.markdown({"rows": rows, "date": "d", "machine": {"name": "m"}})
    assert "## goals (issue 13)" in text
    assert "| unbound job <= 1.05 x eager | resnet50 | dbml-none: 1.200 x eager | **NO** |" in text


def test_no_emulated_rows_no_emulated_goals():
    assert goals.emulated([_row("dbml-tensile@50%", 0.5, 1.5, 50)]) == []
