"""The budget guard: the loop refuses a model call of a turn whose tags fall under an exhausted enforced budget.

Tags carry no meaning in the loop; this component only applies what billing stored. Billing, the single
authority on spend, keeps the state of each budget with ``enforce = true`` in the JetStream key-value bucket
``COS_BUDGETS`` (`commonos.billing.enforcement`, `commonos.proto.budget_state`). The guard:

* watches the bucket, so it knows in memory which tags are enforced (cheap; no I/O for other turns);
* before each model call of a turn carrying such a tag (children copy their parent's tags), reads that budget's
  key FRESH: a ``STREAM.MSG.GET`` answered by the stream's leader, not a direct get a follower may answer from
  an older copy. A call that starts after billing stored the exhaustion therefore sees it;
* refuses (:class:`BudgetRefused`) when the state says exhausted and its period has not ended (a new period is
  allowed again; a raised limit is allowed once billing stores it, at its next start).

No bucket (billing never ran with an enforced budget) means no enforcement. While billing is down, spend is not
counted, so nothing gets exhausted: the bound on overshoot (ARCHITECTURE.md, "Enforced budgets") holds only
while billing runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Final

import msgspec
from nats.js import JetStreamContext
from nats.js.errors import BucketNotFoundError, NotFoundError

from commonos.loop import metrics
from commonos.proto.budget_state import BUDGETS_BUCKET, BUDGETS_STREAM, BudgetState, decode_state
from commonos.proto.errors import DataError
from commonos.proto.events import utcnow

__all__ = ["BudgetGuard", "BudgetRefused", "refusal"]

log = logging.getLogger("commonos.loop.budgets")

RETRY_S: Final = 2.0


class BudgetRefused(DataError):
    """A model call refused by an enforced budget; the message is the reason the turn fails with."""

    def __init__(self, state: BudgetState) -> None:
        self.state = state
        super().__init__(refusal_reason(state))


def refusal_reason(state: BudgetState) -> str:
    return (
        f"model call refused: budget {state.budget!r} (tag {state.tag}) is exhausted: spent {state.spent_usd} USD "
        f"of its {state.limit_usd} USD limit for the {state.period} from {state.period_start:%Y-%m-%dT%H:%MZ} "
        f"to {state.period_end:%Y-%m-%dT%H:%MZ}"
    )


def refusal(state: BudgetState | None, tags: Iterable[str], now: datetime) -> BudgetState | None:
    """The state that refuses a call of a turn with ``tags`` at ``now``, or None. Pure."""
    if state is None or state.tag not in set(tags):
        return None
    if state.exhausted and state.spent_usd >= state.limit_usd and state.period_start <= now < state.period_end:
        return state
    return None


class BudgetGuard:
    """Knows the enforced budgets from a watch of ``COS_BUDGETS`` and checks a turn before each model call."""

    def __init__(self, js: JetStreamContext, clock: Callable[[], datetime] = utcnow) -> None:
        self.js = js
        self.clock = clock
        #: key → tag of each enforced budget billing stored.
        self._tags: dict[str, str] = {}
        self._task: asyncio.Task[None] | None = None
        self._ready = asyncio.Event()

    def enforced_keys(self, tags: Iterable[str]) -> list[str]:
        wanted = set(tags)
        return [key for key, tag in self._tags.items() if tag in wanted]

    async def start(self, wait_s: float = 5.0) -> None:
        """Start the watch; waits (up to ``wait_s``) until the bucket's current keys are known, if it exists."""
        self._task = asyncio.get_running_loop().create_task(self._watch(), name="budget-guard")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._ready.wait(), wait_s)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def check(self, tags: Iterable[str]) -> None:
        """Raise :class:`BudgetRefused` when an enforced budget of ``tags`` is exhausted now."""
        tags = tuple(tags)
        for key in self.enforced_keys(tags):
            state = await self.fresh(key)
            refused = refusal(state, tags, self.clock())
            if refused is not None:
                metrics.MODEL_CALLS_REFUSED.labels(refused.budget).inc()
                raise BudgetRefused(refused)

    async def fresh(self, key: str) -> BudgetState | None:
        """The key's value as the stream's leader has it (no direct get); None when deleted or unreadable."""
        try:
            msg = await self.js.get_last_msg(BUDGETS_STREAM, f"$KV.{BUDGETS_BUCKET}.{key}", direct=False)
        except NotFoundError:
            return None
        headers = msg.headers or {}
        if headers.get("KV-Operation") in ("DEL", "PURGE") or not msg.data:
            return None
        try:
            return decode_state(msg.data)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            log.error("budget state %s is unreadable, not enforced: %s", key, exc)
            return None

    async def _watch(self) -> None:
        while True:
            try:
                kv = await self.js.key_value(BUDGETS_BUCKET)
            except BucketNotFoundError:
                self._ready.set()  # no bucket: nothing is enforced (yet)
                await asyncio.sleep(RETRY_S)
                continue
            except Exception as exc:
                log.warning("cannot open the budget bucket (retrying): %s", exc)
                await asyncio.sleep(RETRY_S)
                continue
            try:
                watcher = await kv.watchall()
                async for entry in watcher:
                    if entry is None:
                        self._ready.set()
                        continue
                    if entry.operation in ("DEL", "PURGE") or not entry.value:
                        self._tags.pop(entry.key, None)
                    else:
                        try:
                            self._tags[entry.key] = decode_state(entry.value).tag
                        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                            log.error("budget state %s is unreadable, not enforced: %s", entry.key, exc)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("the budget watch stopped (restarting): %s", exc)
            await asyncio.sleep(RETRY_S)
