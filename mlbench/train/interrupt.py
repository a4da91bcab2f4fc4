"""A stop signal's exception, raised in the rank at once, except inside a write of what the run tells the world
(the MLPerf log, the events): there it waits for the write's end. Raised inside one, it was swallowed by
mlperf-logging's and logging's own `except Exception` and left a line 'Failed to encode: ...' in the log, which
then could not be completed (the run went unpublished), while the run trained on to the end of the grace."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import TypeVar

_depth = 0  # writes in progress (they nest: run_stop writes two lines)
_pending: BaseException | None = None

F = TypeVar("F", bound=Callable)


def deliver(e: BaseException) -> None:
    """From a signal handler: raise E now, or, inside a write, when the outermost write ends."""
    global _pending
    if _depth:
        _pending = e
        return
    raise e


@contextlib.contextmanager
def held() -> Iterator[None]:
    """A write that a stop signal does not cut short; the signal's exception is raised once it ends."""
    global _depth, _pending
    _depth += 1
    pending = None
    try:
        yield
    finally:
        _depth -= 1
        if not _depth:  # a write that failed of itself raises its own error: the run fails either way
            pending, _pending = _pending, None
    if pending is not None:
        raise pending


def whole(method: F) -> F:
    """`held` around a whole method."""
    @functools.wraps(method)
    def wrapper(*args, **kwargs):
        with held():
            return method(*args, **kwargs)
    return wrapper  # type: ignore[return-value]
