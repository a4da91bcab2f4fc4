"""The one error type a user sees: a message, no traceback, exit code 2."""

from __future__ import annotations


class UserError(Exception):
    """Bad input: what is wrong and what would be right. The CLI prints it on one line and exits 2."""

    exit_code = 2
