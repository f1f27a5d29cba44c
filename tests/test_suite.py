"""The test suite's own machinery: what its parallel run relies on."""

import pytest


@pytest.mark.xdist_group("ray")
def test_a_tests_xdist_group_takes_effect(request):
    """Under ``--dist loadgroup`` (pyproject's addopts) a test marked ``xdist_group("ray")`` is
    named with the group, which is what sends every Ray test to one worker: one Ray cluster per
    session. pytest 9 with pytest-xdist 3.8 dropped the name silently (pyproject pins pytest < 9)."""
    if not getattr(request.config.option, "loadgroup", False):
        pytest.skip("not under pytest-xdist's --dist loadgroup")
    assert request.node.nodeid.endswith("@ray"), request.node.nodeid
