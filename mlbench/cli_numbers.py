"""The click types of every number a command takes: `INT` and `FLOAT` in place of click's, which read Unicode digits
(`--nodes ٣` ran 3 nodes, `--seed ５` seed 5, `--lr ０.１` a learning rate of 0.1) and '_' (`--nodes 1_0`).
Each refusal names the flag and says an ASCII number is expected. tests/test_bad_input.py checks that no option of
any command is left with click's own types."""

from __future__ import annotations

from typing import Any

import click

from mlbench.ascii_numbers import is_ascii_float, is_ascii_int, read_as

SHOWN = 24  # characters of a refused value shown (a 400-digit one filled the screen)


def shown(value: object) -> str:
    """VALUE as a refusal quotes it: whole up to SHOWN characters, else its start and its length."""
    text = str(value)
    return repr(text) if len(text) <= SHOWN else f"{text[:12]!r}... ({len(text)} characters)"


def misread(text: str, integer: bool) -> bool:
    """Whether TEXT, no number written in ASCII, is a number as Python reads it ('٣', '1_0') or holds characters
    other than ASCII ('²'): what `not_ascii` says, where a type has words of its own for other text."""
    ascii_number = is_ascii_int(text) if integer else is_ascii_float(text)
    return not ascii_number and (not text.isascii() or read_as(text, integer) is not None)


def not_ascii(text: str, integer: bool) -> str:
    """Why TEXT is refused: not a number written in ASCII; with what Python would have read it as, where it reads
    one (the value the user meant)."""
    what = "an integer in ASCII digits (0-9)" if integer else "a number in ASCII (digits 0-9, '.', 'e')"
    meant = read_as(text, integer)
    hint = f" (write {meant!r})" if meant is not None and len(str(meant)) <= SHOWN else ""
    return f"expected {what}, got {shown(text)}{hint}"


# No integer option takes a value past a 64-bit integer (devices and batches stop at 2**20, seeds at 2**32): one
# past it is refused here, where it is shown cut, and not later, where a refusal quoted all 4,000 of its digits.
MAX_INT = 2**63 - 1


def past_any_value(text: str) -> str:
    """Why TEXT, an integer too large for any option, is refused."""
    return f"{shown(text)} has {len(text.lstrip('+-')):,} digits, past any value of this option (at most {MAX_INT:,})"


class AsciiInt(click.types.IntParamType):
    """An integer in ASCII digits, with a sign or not, within a 64-bit integer."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and not is_ascii_int(value):
            self.fail(not_ascii(value, integer=True), param, ctx)
        try:
            n = super().convert(value, param, ctx)  # (a default: an int already)
        except click.BadParameter:  # past the digits int() reads (4,300)
            n = None
        if n is None or abs(n) > MAX_INT:
            self.fail(past_any_value(str(value)), param, ctx)
        return n


class AsciiFloat(click.types.FloatParamType):
    """A number as float() reads it, written in ASCII without '_'."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and not is_ascii_float(value):
            self.fail(not_ascii(value, integer=False), param, ctx)
        return super().convert(value, param, ctx)


INT = AsciiInt()
FLOAT = AsciiFloat()
