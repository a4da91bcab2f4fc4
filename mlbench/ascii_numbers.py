"""Numbers written as a user types them: ASCII digits only.

Python's int() and float() read any Unicode decimal digit: '٣' (Arabic-Indic three) and '５' (fullwidth five) are
3 and 5 to them, '1_000' is 1000, and str.isdigit() takes '²' besides. A number given as text (a flag, a value of a
benchmark file, a blend's weight) is read here, so that what a user sees is what is used: anything but ASCII
digits, a sign, a decimal point and an exponent is not a number.
"""

from __future__ import annotations

import re

_INT = re.compile(r"[+-]?[0-9]+")
# float()'s own syntax, in ASCII and without '_': 1, 1., .5, 1e-3, and the words inf, infinity and nan (which the
# checks of each value's range then refuse where they make no sense, naming the value)
_FLOAT = re.compile(r"[+-]?(?:(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|inf|infinity|nan)", re.IGNORECASE)


def is_ascii_int(text: str) -> bool:
    """Whether TEXT is an integer in ASCII digits, with a sign or not (int() may still refuse it: past 4,300
    digits)."""
    return _INT.fullmatch(text) is not None


def is_ascii_float(text: str) -> bool:
    """Whether TEXT is a number as float() reads it, written in ASCII without '_'."""
    return _FLOAT.fullmatch(text) is not None


def read_as(text: str, integer: bool) -> int | float | None:
    """What Python would read TEXT as (int() or float()), though it is no ASCII number: '٣' as 3; else None. For a
    refusal to say what was meant."""
    try:
        return int(text) if integer else float(text)
    except ValueError:
        return None
