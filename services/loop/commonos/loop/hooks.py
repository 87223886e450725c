"""Loop hooks: code a profile plugs into its turns, to observe them and shape them, without editing the loop.

A profile names its hooks in `config.toml` (`hooks = ["log", "my-guard"]`): a built-in one by its name
(`commonos.loop.profiles.BUILTIN_HOOKS`), any other by the name of an entry point of the `commonos.hooks` group,
whose object is a `Hook` subclass (or any callable taking a `HookSetup` and returning a `Hook`). An unknown name is a
`ProfileError` naming the file and the key (`hooks[1]: unknown hook 'x' (...)`).

Each point receives the turn's `TurnInfo` (the seed's "every hook, tool and journal call receives a
TurnInfo"). The points, in the order a turn meets them:

* `turn_started(turn)`: after the turn's `turn_started` is recorded.
* `message_appended(turn, message, seq)`: after each message of the turn is recorded (the user's text, each
  assistant message, each tool result).
* `before_model_call(turn, request)`: before each model call. Return None to leave the request as it is, or a
  new `ModelRequest`: the model is called with it, and its `messages` become the conversation the turn goes
  on from (so a compaction hook can replace the history it is given; nothing is recorded for it by the loop).
* `after_model_call(turn, request, response)`: after the call's `model_call_completed` is recorded, before
  its assistant message is.
* `before_tool_call(turn, call)`: before the approval policy, for a call of a tool the profile offers.
  Return None to let the policy decide, or a `Refusal`: the call does not run, and it is recorded as a
  refusal like the policy's (`approval_decided` denied by `hook:<name>`, then `tool_call_recorded` with the
  reason as its error result). The first hook that refuses decides; the hooks after it are not asked.
* `after_tool_call(turn, call, record)`: after the call's `tool_call_recorded` is stored (run, refused or
  unknown), before its result message is appended.
* `turn_finished(turn, status, error)`: as the turn ends, just before its `turn_finished` is recorded, for
  every turn that started (completed, failed, cancelled, interrupted), with the status and error it is ending
  with. Every hook is told, even when one before it raised.

At every point the hooks run one after the other, in the order the profile lists them; `before_model_call`
hands each hook the request as the hooks before it left it, and at `before_tool_call` the first refusal
ends the asking. A delegated child turn runs the same profile's
hooks for itself.

What a failing hook does: an exception raised by a hook is an error of the turn, never of the loop. The turn
stops there and finishes `failed`, its error naming the hook and the point (`hook 'guard' failed in
before_tool_call: ValueError: ...`), recorded with its `turn_finished`. An exception in `turn_finished`
fails a turn that was completing; a turn already failed, cancelled or interrupted keeps its status, the
hook's error added to its own. `asyncio.CancelledError` is not a hook's failure: it cancels the turn as
it would anywhere else.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from commonos.loop import metrics, profiles
from commonos.loop.journal import Journal, ModelCall, ToolCallRecord
from commonos.loop.profiles import Profile, hook_names
from commonos.loop.providers.base import ModelRequest, ModelResponse, Provider
from commonos.proto.errors import DataError
from commonos.proto.events import TurnStatus
from commonos.proto.identity import TurnInfo
from commonos.proto.messages import Message, ToolCall

log = logging.getLogger(__name__)

#: The points, in the order a turn meets them (a hook's failure names one).
POINTS: Final = (
    "turn_started",
    "message_appended",
    "before_model_call",
    "after_model_call",
    "before_tool_call",
    "after_tool_call",
    "turn_finished",
)


@dataclass(frozen=True)
class HookSetup:
    """What a hook is built with, once per profile when the loop starts."""

    #: The name the profile gave it in `config.toml`.
    name: str
    profile: Profile
    journal: Journal
    #: The profile's model provider, for a hook that calls the model itself (record it with
    #: `record_model_call`, as the loop records its own calls).
    provider: Provider | None = None


async def record_model_call(journal: Journal, turn: TurnInfo, response: ModelResponse, model: str) -> uuid.UUID:
    """Record a model call of the turn as the loop records its own: a `model_call_completed` with the turn's
    tags (what billing counts), and the call's metrics. Returns the event's id."""
    call = ModelCall(
        provider=response.provider,
        model=response.model,
        usage=response.usage,
        request_id=response.request_id,
        latency_s=response.latency_s,
        stop_reason=response.stop_reason,
    )
    await journal.record_model_call(turn, call)
    if response.latency_s is not None:
        metrics.MODEL_SECONDS.labels(response.provider, model).observe(response.latency_s)
    metrics.MODEL_TOKENS.labels(response.provider, "input").observe(response.usage.total_input_tokens)
    metrics.MODEL_TOKENS.labels(response.provider, "output").observe(response.usage.output_tokens)
    return call.event_id


@dataclass(frozen=True)
class Refusal:
    """A `before_tool_call`'s answer: do not run the call, for this reason (the model sees it)."""

    reason: str


class Hook:
    """A loop hook. Override the points you need: every one does nothing by default. Each is a coroutine
    and receives the turn's `TurnInfo` first."""

    def __init__(self, setup: HookSetup) -> None:
        self.setup = setup

    @property
    def name(self) -> str:
        return self.setup.name

    async def turn_started(self, turn: TurnInfo) -> None:
        return None

    async def message_appended(self, turn: TurnInfo, message: Message, seq: int) -> None:
        return None

    async def before_model_call(self, turn: TurnInfo, request: ModelRequest) -> ModelRequest | None:
        return None

    async def after_model_call(self, turn: TurnInfo, request: ModelRequest, response: ModelResponse) -> None:
        return None

    async def before_tool_call(self, turn: TurnInfo, call: ToolCall) -> Refusal | None:
        return None

    async def after_tool_call(self, turn: TurnInfo, call: ToolCall, record: ToolCallRecord) -> None:
        return None

    async def turn_finished(self, turn: TurnInfo, status: TurnStatus, error: str | None) -> None:
        return None


HookFactory = Callable[[HookSetup], Hook]


class LogHook(Hook):
    """Built-in `log`: one INFO line per point (`commonos.loop.hooks` logger), nothing else."""

    async def turn_started(self, turn: TurnInfo) -> None:
        log.info("turn %s of %s started (depth %d)", turn.turn_id, turn.profile_id, turn.depth)

    async def message_appended(self, turn: TurnInfo, message: Message, seq: int) -> None:
        log.info("turn %s: message %d appended (%s)", turn.turn_id, seq, type(message).__name__)

    async def before_model_call(self, turn: TurnInfo, request: ModelRequest) -> ModelRequest | None:
        log.info("turn %s: model call with %d messages", turn.turn_id, len(request.messages))
        return None

    async def after_model_call(self, turn: TurnInfo, request: ModelRequest, response: ModelResponse) -> None:
        log.info("turn %s: model call answered (%s)", turn.turn_id, response.stop_reason)

    async def before_tool_call(self, turn: TurnInfo, call: ToolCall) -> Refusal | None:
        log.info("turn %s: tool call %s", turn.turn_id, call.name)
        return None

    async def after_tool_call(self, turn: TurnInfo, call: ToolCall, record: ToolCallRecord) -> None:
        log.info("turn %s: tool call %s recorded (error: %s)", turn.turn_id, call.name, record.is_error)

    async def turn_finished(self, turn: TurnInfo, status: TurnStatus, error: str | None) -> None:
        log.info("turn %s finished %s", turn.turn_id, status.value)


#: The built-in hooks defined here (`compaction`, the other one, is `commonos.loop.compaction`'s, which builds on
#: this module: it is found through its entry point, as an installed hook is).
BUILTIN_FACTORIES: Final[Mapping[str, HookFactory]] = {"log": LogHook}


class HookFailed(DataError):
    """A hook raised: the turn fails with this message, naming the hook and the point."""

    def __init__(self, hook: str, point: str, exc: BaseException) -> None:
        super().__init__(f"hook {hook!r} failed in {point}: {type(exc).__name__}: {exc}")
        self.hook = hook
        self.point = point


class HookLoadError(DataError):
    """A hook named by a profile that cannot be loaded or built (the loop reports it as the profile's error)."""


def hook_factory(name: str) -> HookFactory:
    """The factory of the hook called `name` (a built-in one wins); `HookLoadError` if there is none or
    its entry point cannot be loaded."""
    if name in BUILTIN_FACTORIES:
        return BUILTIN_FACTORIES[name]
    entry = profiles.hook_entry_points().get(name)
    if entry is None:
        raise HookLoadError(f"unknown hook {name!r} (one of {', '.join(hook_names())})")
    try:
        factory: HookFactory = entry.load()
    except Exception as exc:
        raise HookLoadError(f"hook {name!r}: cannot load {entry.value}: {type(exc).__name__}: {exc}") from None
    if not callable(factory):
        raise HookLoadError(f"hook {name!r}: {entry.value} is not a Hook class or factory")
    return factory


def build_hooks(
    profile: Profile,
    journal: Journal,
    factories: Mapping[str, HookFactory] | None = None,
    provider: Provider | None = None,
) -> tuple[Hook, ...]:
    """The profile's hooks, built in the order its `hooks` lists them; `factories` (by name) come before the
    built-in and installed ones (tests use them). `HookLoadError` for one that cannot be built."""
    hooks: list[Hook] = []
    for name in profile.hooks:
        factory = (factories or {}).get(name) or hook_factory(name)
        try:
            hook = factory(HookSetup(name=name, profile=profile, journal=journal, provider=provider))
        except Exception as exc:
            raise HookLoadError(f"hook {name!r}: cannot be built: {type(exc).__name__}: {exc}") from None
        if not isinstance(hook, Hook):
            raise HookLoadError(f"hook {name!r}: its factory returned {type(hook).__name__}, not a Hook")
        hooks.append(hook)
    return tuple(hooks)


class TurnHooks:
    """A profile's hooks, run at each point in order; an exception of one becomes `HookFailed`."""

    def __init__(self, hooks: Sequence[Hook] = ()) -> None:
        self.hooks = tuple(hooks)

    def __bool__(self) -> bool:
        return bool(self.hooks)

    async def _each(self, point: str, *args: Any) -> None:
        for hook in self.hooks:
            await self._call(hook, point, *args)

    @staticmethod
    async def _call(hook: Hook, point: str, *args: Any) -> Any:
        try:
            return await getattr(hook, point)(*args)
        except HookFailed:
            raise
        except Exception as exc:
            log.warning("hook %r failed in %s: %s: %s", hook.name, point, type(exc).__name__, exc)
            raise HookFailed(hook.name, point, exc) from exc

    async def turn_started(self, turn: TurnInfo) -> None:
        await self._each("turn_started", turn)

    async def message_appended(self, turn: TurnInfo, message: Message, seq: int) -> None:
        await self._each("message_appended", turn, message, seq)

    async def before_model_call(self, turn: TurnInfo, request: ModelRequest) -> ModelRequest:
        for hook in self.hooks:
            replaced = await self._call(hook, "before_model_call", turn, request)
            if replaced is not None:
                if not isinstance(replaced, ModelRequest):
                    raise HookFailed(
                        hook.name,
                        "before_model_call",
                        TypeError(f"returned {type(replaced).__name__}, not a ModelRequest or None"),
                    )
                request = replaced
        return request

    async def after_model_call(self, turn: TurnInfo, request: ModelRequest, response: ModelResponse) -> None:
        await self._each("after_model_call", turn, request, response)

    async def before_tool_call(self, turn: TurnInfo, call: ToolCall) -> tuple[str, Refusal] | None:
        """The first refusal and the name of the hook that gave it; None when every hook lets the call go on."""
        for hook in self.hooks:
            answer = await self._call(hook, "before_tool_call", turn, call)
            if answer is None:
                continue
            if not isinstance(answer, Refusal):
                raise HookFailed(
                    hook.name,
                    "before_tool_call",
                    TypeError(f"returned {type(answer).__name__}, not a Refusal or None"),
                )
            return hook.name, answer
        return None

    async def after_tool_call(self, turn: TurnInfo, call: ToolCall, record: ToolCallRecord) -> None:
        await self._each("after_tool_call", turn, call, record)

    async def turn_finished(self, turn: TurnInfo, status: TurnStatus, error: str | None) -> None:
        """Every hook is told, even after one failed; then the first failure is raised."""
        failed: HookFailed | None = None
        for hook in self.hooks:
            try:
                await self._call(hook, "turn_finished", turn, status, error)
            except HookFailed as exc:
                failed = failed or exc
        if failed is not None:
            raise failed
