"""When a turn received over telemetry is over (pure: no I/O).

Neither Claude Code nor Codex logs the end of a turn: their telemetry says when a prompt's work starts
(``user_prompt``, ``codex.user_prompt``) and what it did, never that it is done. So the gateway decides,
from what it received, and says so:

* **The session's next prompt ends the turns before it.** A turn of a session in which a later prompt is
  known (a prompt record whose time is after the turn's start) is over: the CLI took the next prompt. The
  order of arrival does not matter: a prompt that arrives after a later one is over as soon as it is known.
* **A turn with no record for** ``COS_OTLP_TURN_IDLE_S`` (1800 s by default), counted from when the gateway
  last received one of its records (not from the records' own times, which may be old: a replay, a retry),
  is over.

Either way the end is decided once no record of the turn has arrived for a moment (``settle_s``: twice
``COS_OTLP_PUBLISH_TIMEOUT_S`` and a second, 11 s by default), by which time every request that brought
one has had its events acknowledged or refused: the turn's announcement is stored before its end, and a
record of the turn that an exporter sends a little late still counts in its last record's time.

Its ``turn_finished`` has ``finished_at`` (the event's ``occurred_at``) at the **turn's last record's own
time**, and the status ``interrupted``, with the reason in ``error``. Why ``interrupted``: ``completed``
would claim the agent finished its work, and nothing in the telemetry says so (in the recorded
``interrupted`` scenarios the CLI was killed mid-turn, and what followed was the next prompt, exactly as
after a turn that completed); ``failed`` and ``cancelled`` claim an error or someone's cancellation, which
nothing shows either. ``interrupted`` is what the loop records for a turn whose end nobody observed (its
process gone, `COS_TURN_STALE_S`): the turn stopped, how is not known. The ``error`` says which rule ended
it and that the vendor logs no end.

What each session's turns are is kept durably (`SessionTurns`, one NATS KV entry a session in
``COS_OTLP_STATE``, `ordinals.KvOrdinals`): every request merges what it saw (`merge`, commutative: the
earliest start, the latest record, the latest arrival), and the gateway's sweeper
(:mod:`~commonos.otlp_gateway.sweeper`) decides the ends (`decide`) by compare-and-set on that entry, so two
replicas or a restarted gateway decide each end once, and stores the decision before publishing it. The
``turn_finished``'s id is ``gateway_id("turn_finished", scope, session, turn key)``: a decision published
again (a replica that died between publishing and saying so) is the same event, dropped by JetStream.

A record of a turn already ended (an exporter's late retry, a permission prompt answered after the idle
time) is stored in that turn as usual; the turn's end does not move (the journal-writer keeps the first
end). A session whose turns are all over is forgotten once it has been quiet for the idle time: a record
of it arriving after that starts its state afresh, and an end decided again for an old turn changes nothing
stored (the first end stays; the event has the same id).
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Final

import msgspec

from commonos.proto.events import EventBase, SessionCreated, TurnFinished, TurnStarted, TurnStatus
from commonos.proto.graph.ids import vendor_scope, vendor_session_id, vendor_turn_id
from commonos.proto.ids import GATEWAY_NAMESPACE, name_id

#: The status of a turn the gateway ends (see the module's docstring).
ENDED: Final = TurnStatus.INTERRUPTED
#: The most turns of a session kept (those over first, the oldest first, are dropped beyond it).
MAX_TURNS: Final = 100


class TurnEnd(msgspec.Struct, frozen=True, kw_only=True):
    """A decided end: its time (the turn's last record's), why, and whether its event was acknowledged."""

    at: datetime
    reason: str
    published: bool = False


class TurnState(msgspec.Struct, frozen=True, kw_only=True):
    """What the gateway knows of one turn."""

    key: str
    #: Its prompt's time; until its prompt record arrives, its earliest record's.
    started: datetime
    #: Its latest record's time.
    last: datetime
    #: When the gateway last received a record of it (seconds since the epoch, the gateway's clock).
    seen: float
    #: Its prompt record was received (its start is a real prompt: it ends the turns before it).
    prompted: bool = False
    end: TurnEnd | None = None


class SessionTurns(msgspec.Struct, frozen=True, kw_only=True):
    """A vendor session's turns, as one profile's token sent them."""

    vendor: str
    profile_id: str
    session_key: str
    #: The tags of the session's first request (for the events announcing it again).
    tags: tuple[str, ...] = ()
    turns: tuple[TurnState, ...] = ()

    @property
    def scope(self) -> str:
        return vendor_scope(self.vendor, self.profile_id)

    @property
    def session_id(self) -> uuid.UUID:
        return uuid.UUID(vendor_session_id(self.vendor, self.profile_id, self.session_key))

    def turn(self, key: str) -> TurnState | None:
        return next((t for t in self.turns if t.key == key), None)

    def open(self) -> list[TurnState]:
        return [t for t in self.turns if t.end is None]

    def unpublished(self) -> list[TurnState]:
        """Turns whose end is decided and not yet known to be published."""
        return [t for t in self.turns if t.end is not None and not t.end.published]

    def seen(self) -> float:
        return max((t.seen for t in self.turns), default=0.0)

    def turn_at(self, at: datetime) -> str | None:
        """The key of the turn whose prompt came last at or before `at` (a tie: the one listed last), or None."""
        best: tuple[datetime, int, str] | None = None
        for place, t in enumerate(self.turns):
            if t.prompted and t.started <= at and (best is None or (t.started, place) >= best[:2]):
                best = (t.started, place, t.key)
        return best[2] if best is not None else None


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(SessionTurns)


def encode(state: SessionTurns) -> bytes:
    return _encoder.encode(state)


def decode(data: bytes) -> SessionTurns:
    return _decoder.decode(data)


def _merge_turn(old: TurnState, new: TurnState) -> TurnState:
    if old.prompted != new.prompted:
        started = old.started if old.prompted else new.started
    else:
        started = min(old.started, new.started)
    return TurnState(
        key=old.key,
        started=started,
        last=max(old.last, new.last),
        seen=max(old.seen, new.seen),
        prompted=old.prompted or new.prompted,
        end=_merge_end(old.end, new.end),
    )


def _merge_end(old: TurnEnd | None, new: TurnEnd | None) -> TurnEnd | None:
    if old is None or new is None:
        return old or new
    # One decision a turn: the one stored first; published once either copy says so.
    return TurnEnd(at=old.at, reason=old.reason, published=old.published or new.published)


def merge(stored: SessionTurns | None, seen: SessionTurns, max_turns: int = MAX_TURNS) -> SessionTurns:
    """`stored` with what a request saw (`seen`) added: each turn's earliest start (its prompt's once known),
    latest record and latest arrival. Commutative and idempotent, so replicas and retries agree."""
    if stored is None:
        return _bounded(seen, max_turns)
    turns = {t.key: t for t in stored.turns}
    for turn in seen.turns:
        known = turns.get(turn.key)
        turns[turn.key] = turn if known is None else _merge_turn(known, turn)
    merged = msgspec.structs.replace(stored, tags=stored.tags or seen.tags, turns=tuple(turns.values()))
    return _bounded(merged, max_turns)


def _bounded(state: SessionTurns, max_turns: int) -> SessionTurns:
    if len(state.turns) <= max_turns:
        return state
    over = sorted((t for t in state.turns if t.end is not None and t.end.published), key=lambda t: t.started)
    drop = {t.key for t in over[: len(state.turns) - max_turns]}
    return msgspec.structs.replace(state, turns=tuple(t for t in state.turns if t.key not in drop))


def decide(state: SessionTurns, now: float, idle_s: float, settle_s: float = 0.0) -> SessionTurns:
    """`state` with the end of every open turn that is over decided (see the module's docstring); the
    same state when none is. A decision depends on the state alone, and on `now` for idleness and
    `settle_s`: a turn of which a record arrived less than `settle_s` ago is left open whatever the rules
    say, so that the request that brought it has published its events (the turn's announcement) first."""
    prompts = sorted(t.started for t in state.turns if t.prompted)
    changed = False
    turns = []
    for turn in state.turns:
        end = None
        if turn.end is None and now - turn.seen >= settle_s:
            later = next((p for p in prompts if p > turn.started), None)
            if later is not None:
                reason = (
                    f"ended by the session's next prompt ({later.isoformat()}): {state.vendor} logs no end of a turn,"
                    " so whether it completed is not known"
                )
                end = TurnEnd(at=turn.last, reason=reason)
            elif now - turn.seen >= idle_s:
                reason = (
                    f"no record for {idle_s:g} s (COS_OTLP_TURN_IDLE_S): {state.vendor} logs no end of a turn,"
                    " so whether it completed is not known"
                )
                end = TurnEnd(at=turn.last, reason=reason)
        changed = changed or end is not None
        turns.append(turn if end is None else msgspec.structs.replace(turn, end=end))
    return msgspec.structs.replace(state, turns=tuple(turns)) if changed else state


def published(state: SessionTurns, keys: set[str]) -> SessionTurns:
    """`state` with the ends of the turns `keys` marked published."""
    return msgspec.structs.replace(
        state,
        turns=tuple(
            msgspec.structs.replace(t, end=msgspec.structs.replace(t.end, published=True))
            if t.end is not None and t.key in keys
            else t
            for t in state.turns
        ),
    )


def forgettable(state: SessionTurns, now: float, idle_s: float) -> bool:
    """Every turn over and published, and nothing received for the idle time: the state may be deleted."""
    return all(t.end is not None and t.end.published for t in state.turns) and now - state.seen() >= idle_s


def _gateway_id(*parts: str) -> uuid.UUID:
    return name_id(GATEWAY_NAMESPACE, *parts)


def end_events(state: SessionTurns, turn: TurnState) -> list[EventBase]:
    """The events of a decided end: the session and the turn announced again (the same ids as the mapping's
    announcements, so nothing new when they are stored already; a turn whose own request never reached
    JetStream is then still started before it ends), then its ``turn_finished``."""
    assert turn.end is not None
    scope, session_id = state.scope, state.session_id
    started = min(turn.started, turn.end.at)
    return [
        SessionCreated(
            event_id=_gateway_id("session_created", scope, state.session_key),
            occurred_at=started,
            profile_id=state.profile_id,
            session_id=session_id,
            source=state.vendor,
            tags=state.tags,
        ),
        TurnStarted(
            event_id=_gateway_id("turn_started", scope, state.session_key, turn.key),
            occurred_at=started,
            profile_id=state.profile_id,
            session_id=session_id,
            turn_id=vendor_turn_id(scope, state.session_key, turn.key),
            tags=state.tags,
        ),
        TurnFinished(
            event_id=_gateway_id("turn_finished", scope, state.session_key, turn.key),
            occurred_at=turn.end.at,
            profile_id=state.profile_id,
            session_id=session_id,
            turn_id=vendor_turn_id(scope, state.session_key, turn.key),
            status=ENDED,
            error=turn.end.reason,
        ),
    ]
