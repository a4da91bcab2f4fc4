"""The one quality comparison."""

from __future__ import annotations

import pytest

from mlbench.quality import operator, reached


def test_reached_at_and_past_the_target_in_each_direction():
    assert reached(3.3, 3.3, "min") and reached(3.2, 3.3, "min") and not reached(3.31, 3.3, "min")
    assert reached(0.72, 0.72, "max") and reached(0.8, 0.72, "max") and not reached(0.71, 0.72, "max")
    assert not reached(float("nan"), 3.3, "min") and not reached(float("nan"), 0.72, "max")
    assert (operator("min"), operator("max")) == ("<=", ">=")
    with pytest.raises(ValueError, match="'up'"):
        reached(1.0, 1.0, "up")  # type: ignore[arg-type]
