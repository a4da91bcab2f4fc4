"""Whether an evaluation reached its quality target: the one comparison, and the operator that writes it."""

from __future__ import annotations

from typing import Literal

Direction = Literal["min", "max"]  # min: reached when value <= target (loss); max: when value >= target (accuracy)


def reached(value: float, target: float, direction: Direction) -> bool:
    if direction == "min":
        return value <= target
    if direction == "max":
        return value >= target
    raise ValueError(f"quality direction {direction!r}: expected 'min' or 'max'")


def operator(direction: Direction) -> str:
    """The comparison as text, for "target <= 3.3" and the like."""
    return "<=" if direction == "min" else ">="
