"""tests/sampled.py: the default run keeps the named members of a family, the others carry `slow`, and a kept
name that is no member (a renamed case) is refused rather than silently dropped from CI."""

import pytest

from sampled import sampled


def test_kept_members_run_by_default_and_the_others_are_slow():
    params = sampled(["small", "ragged", "edge"], keep=("small", "edge"))
    assert params[0] == "small" and params[2] == "edge"
    assert params[1].values == ("ragged",) and [m.name for m in params[1].marks] == ["slow"]


def test_a_kept_name_that_is_no_member_is_refused():
    with pytest.raises(ValueError, match=r"kept values \['tiny'\] are not parameters"):
        sampled({"small": 1, "ragged": 2}, keep=("tiny",))
