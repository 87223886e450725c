"""Waiting between attempts: a capped exponential backoff, and a sleep that a stop event cuts short.

Every retry loop of the services waits the same way: a first pause, doubled after each failure up to
a ceiling, back to the first pause after a success; and a service stopping (SIGTERM) does not sit out
the pause. A retry library (tenacity) would bring decorators and policies none of these loops need:
each decides itself what to retry, what to log and when to give up.
"""

from __future__ import annotations

import asyncio
import contextlib


class Backoff:
    """Pauses of `initial`, `initial * factor`, ... never above `maximum`; `reset()` starts again.

    A retry loop sleeps `next()` after each failure (`await sleep_or_stop(stop, backoff.next())`) and
    calls `reset()` after a success.
    """

    __slots__ = ("_delay", "factor", "initial", "maximum")

    def __init__(self, initial: float, maximum: float, factor: float = 2.0) -> None:
        if initial <= 0 or maximum < initial or factor < 1:
            raise ValueError(f"Backoff({initial}, {maximum}, {factor}): need 0 < initial <= maximum and factor >= 1")
        self.initial = initial
        self.maximum = maximum
        self.factor = factor
        self._delay = initial

    @property
    def current(self) -> float:
        """The pause `next()` returns now."""
        return self._delay

    def next(self) -> float:
        """The pause to take now; the one after it is `factor` times longer, up to `maximum`."""
        delay = self._delay
        self._delay = min(delay * self.factor, self.maximum)
        return delay

    def reset(self) -> None:
        """An attempt succeeded: the next failure pauses `initial` again."""
        self._delay = self.initial


async def sleep_or_stop(stop: asyncio.Event, seconds: float) -> bool:
    """Sleep `seconds`, or less if `stop` is set meanwhile; True when `stop` is set."""
    if not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), seconds)
    return stop.is_set()
