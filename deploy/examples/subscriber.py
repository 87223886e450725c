"""A CommonOS event subscriber: its own durable pull consumer on COS_EVENTS, printing every event it reads.

    pip install nats-py
    eval "$(cos env --user subscriber)"      # COS_NATS_URL, COS_NATS_USER, COS_NATS_PASSWORD
    python subscriber.py --durable my-service --filter 'cos.events.*.*.turn_finished'

One line per event: the stream sequence, the CloudEvents type, the subject and the event id (`--headers`
adds the headers, decoded). Each event is acknowledged after it is printed, so a restarted subscriber goes
on after the last one it acknowledged (the consumer is durable); a crash before the acknowledgement means
the event comes again: make handling idempotent by its event id. One event is in flight at a time
(`max_ack_pending=1`), so each session's events come in stream order, after a crash too; the consumer is
removed by the server after `--inactive-threshold` (7 days) without a reader.

Where a new consumer starts: the first event of the stream (default), `--from-seq N`, `--from-time T`
(JetStream's store time, not the event's time: see deploy/SUBSCRIBERS.md) or `--new`. An existing consumer
goes on where it is; asking it for another filter or start is refused unless `--reset`. `--occurred-after T`
skips (acknowledges without printing) events whose body's `occurred_at` is earlier. It stops on SIGTERM or
Ctrl-C within a second, after `--max N` events, or after `--idle-exit S` seconds without one.

Exit status: 0 stopped as asked, 1 an error (one line on stderr), 2 bad arguments.
Needs nothing but nats-py; deploy/SUBSCRIBERS.md explains the contract.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import signal
import sys
import time
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import unquote

import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, ConsumerInfo, DeliverPolicy

STREAM = "COS_EVENTS"
#: How long the first connection may take before the subscriber gives up (a server down, a wrong URL).
CONNECT_TIMEOUT_S = 10.0
_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhd])")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


class Refused(Exception):
    """What the subscriber will not do, said in one line."""


def moment(text: str) -> datetime:
    """An instant: RFC 3339 (`2026-12-01T10:00:00Z`) or a duration ago (`90s`, `15m`, `2h`, `7d`)."""
    match = _DURATION.fullmatch(text.strip())
    if match:
        return datetime.now(UTC) - timedelta(seconds=float(match.group(1)) * _UNITS[match.group(2)])
    try:
        value = datetime.fromisoformat(text.strip().replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is neither RFC 3339 nor a duration such as 15m") from None
    if value.tzinfo is None:
        raise argparse.ArgumentTypeError(f"{text!r} has no time zone (end it with Z for UTC)")
    return value.astimezone(UTC)


def duration(text: str) -> float:
    """Seconds: `30`, `30s`, `15m`, `2h`, `7d`."""
    match = _DURATION.fullmatch(text.strip()) or re.fullmatch(r"(\d+(?:\.\d+)?)()", text.strip())
    if match is None or float(match.group(1)) <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration such as 30s, 15m or 7d")
    return float(match.group(1)) * _UNITS.get(match.group(2), 1)


def rfc3339(value: datetime) -> str:
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


def describe(msg: Msg, *, headers: bool = False) -> str:
    """`<stream seq> <ce-type> <subject> <event id>` of one delivered event (and its headers, decoded)."""
    found = msg.headers or {}
    ce_type = unquote(found.get("ce-type", "?"))
    try:
        body: Any = json.loads(msg.data)
        event_id = str(body["event_id"])
    except (ValueError, KeyError, TypeError):
        event_id = "(not an event)"
    line = f"{msg.metadata.sequence.stream} {ce_type} {msg.subject} {event_id}"
    if headers:
        line += "".join(f"\n  {name}: {unquote(value)}" for name, value in sorted(found.items()))
    return line


def occurred_at(msg: Msg) -> datetime | None:
    try:
        return moment(str(json.loads(msg.data)["occurred_at"]))
    except (ValueError, KeyError, TypeError, argparse.ArgumentTypeError):
        return None


async def connect(args: argparse.Namespace) -> Client:
    """Connect, or fail fast with one line: bad credentials at once, an unreachable server after 10 s.

    nats-py retries a failed first connection for minutes by default (and logs each failure): this asks
    once per server, and reconnects only once connected (a server restart is then waited out)."""
    errors: list[Exception] = []
    auth_failed = asyncio.Event()

    async def on_error(exc: Exception) -> None:
        errors.append(exc)
        if "authorization" in str(exc).lower():
            auth_failed.set()

    options: dict[str, Any] = {
        "servers": [url.strip() for url in args.server.split(",")],
        "name": args.durable or "cos-subscriber",
        "error_cb": on_error,
        "connect_timeout": 3,
        "reconnect_time_wait": 1,
        "max_reconnect_attempts": -1,
        # Replies come to an inbox only this user may read (deploy/nats/auth.conf: `_INBOX_<user>.>`).
        "inbox_prefix": f"_INBOX_{args.user}" if args.user else "_INBOX",
    }
    if args.user:
        options |= {"user": args.user, "password": args.password}
    attempt = asyncio.ensure_future(nats.connect(**options))
    refused = asyncio.ensure_future(auth_failed.wait())
    try:
        await asyncio.wait({attempt, refused}, timeout=CONNECT_TIMEOUT_S, return_when="FIRST_COMPLETED")
    finally:
        refused.cancel()
    failure: BaseException | None = None
    if attempt.done():
        failure = attempt.exception()
        if failure is None and not auth_failed.is_set():
            return attempt.result()
        if failure is None:
            await attempt.result().close()
    else:
        attempt.cancel()
        with contextlib.suppress(BaseException):
            await attempt
    if auth_failed.is_set() or "authorization" in str(failure).lower():
        raise Refused("authorization violation: check COS_NATS_USER/COS_NATS_PASSWORD")
    why = f": {errors[-1]}" if errors else (f": {failure}" if failure else "")
    raise Refused(f"cannot reach NATS at {args.server} within {CONNECT_TIMEOUT_S:.0f}s{why} (check COS_NATS_URL)")


def wanted_config(args: argparse.Namespace) -> ConsumerConfig:
    config = ConsumerConfig(
        durable_name=args.durable,
        filter_subject=args.filter,
        deliver_policy=DeliverPolicy.ALL,
        ack_policy=AckPolicy.EXPLICIT,
        ack_wait=args.ack_wait,
        # One event in flight: an event a crashed run held comes back (after ack_wait) before any later one,
        # so each session's events arrive in stream order, across restarts too (deploy/SUBSCRIBERS.md).
        max_ack_pending=1,
        # Removed by the server after this long without a reader: no consumer is left behind forever.
        inactive_threshold=args.inactive_threshold,
    )
    if args.from_seq is not None:
        config.deliver_policy, config.opt_start_seq = DeliverPolicy.BY_START_SEQUENCE, args.from_seq
    elif args.from_time is not None:
        config.deliver_policy, config.opt_start_time = DeliverPolicy.BY_START_TIME, args.from_time
    elif args.new:
        config.deliver_policy = DeliverPolicy.NEW
    return config


def start_of(config: ConsumerConfig) -> str:
    policy = DeliverPolicy(config.deliver_policy or DeliverPolicy.ALL)
    if policy == DeliverPolicy.BY_START_SEQUENCE:
        return f"--from-seq {config.opt_start_seq}"
    if policy == DeliverPolicy.BY_START_TIME and config.opt_start_time is not None:
        start = config.opt_start_time
        return f"--from-time {rfc3339(start) if isinstance(start, datetime) else start}"
    return {DeliverPolicy.NEW: "--new"}.get(policy, "from the first event")


async def first_seq_at(nc: Client, when: datetime) -> int:
    """The stream sequence of the first event stored at or after `when` (past the last one if none)."""
    js = nc.jetstream()
    reply = await nc.request(
        f"$JS.API.STREAM.MSG.GET.{STREAM}", json.dumps({"start_time": rfc3339(when)}).encode(), timeout=5
    )
    answer = json.loads(reply.data)
    if "message" in answer:
        return int(answer["message"]["seq"])
    return int((await js.stream_info(STREAM)).state.last_seq) + 1


async def ensure_consumer(nc: Client, args: argparse.Namespace) -> ConsumerInfo:
    """Create the durable consumer, or find it as it was; never change its filter or start silently."""
    js = nc.jetstream()
    wanted = wanted_config(args)
    try:
        existing: ConsumerInfo | None = await js.consumer_info(STREAM, args.durable)
    except nats.js.errors.NotFoundError:
        existing = None
    if existing is None:
        return await js.add_consumer(STREAM, wanted)
    have = existing.config
    have_filter = have.filter_subject or ", ".join(have.filter_subjects or []) or ">"
    start_asked = args.from_seq is not None or args.from_time is not None or args.new
    same_filter = have_filter == args.filter
    same_start = not start_asked or start_of(have) == start_of(wanted)
    if same_filter and same_start and not args.reset:
        # Goes on after its last acknowledged event, with this recipe's order and expiry (editable settings).
        kept = {key: getattr(wanted, key) for key in ("ack_wait", "max_ack_pending", "inactive_threshold")}
        if any(getattr(have, key) != value for key, value in kept.items()):
            return await js.add_consumer(STREAM, have.evolve(**kept))
        return existing
    if not args.reset:
        differs = f"reads {have_filter!r}" if not same_filter else f"started {start_of(have)}"
        at = existing.delivered.stream_seq if existing.delivered else 0
        raise Refused(
            f"consumer {args.durable!r} exists and {differs}, at stream sequence {at} "
            f"(this run asked for {args.filter!r}, {start_of(wanted)}): "
            f"keep its position with --filter {have_filter!r}, give this reader another --durable name, "
            "or start this one over with --reset"
        )
    # --reset: the position back to where this run starts, then the new filter (an editable setting). The
    # reset comes first: on a server without it (before nats-server 2.14) nothing has changed.
    if wanted.deliver_policy == DeliverPolicy.BY_START_SEQUENCE:
        seq = int(args.from_seq)
    elif wanted.deliver_policy == DeliverPolicy.BY_START_TIME:
        seq = await first_seq_at(nc, args.from_time)
    elif wanted.deliver_policy == DeliverPolicy.NEW:
        seq = int((await js.stream_info(STREAM)).state.last_seq) + 1
    else:
        seq = 1
    cannot = (
        f"this NATS server cannot reset consumer {args.durable!r} ($JS.API.CONSUMER.RESET needs nats-server 2.14 or "
        "newer): give this reader another --durable name, or ask an admin to delete the consumer"
    )
    try:
        reply = await nc.request(
            f"$JS.API.CONSUMER.RESET.{STREAM}.{args.durable}", json.dumps({"seq": seq}).encode(), 5
        )
    except (nats.errors.TimeoutError, nats.errors.NoRespondersError):
        raise Refused(cannot) from None
    answer = json.loads(reply.data)
    if "error" in answer:
        raise Refused(f"could not reset consumer {args.durable!r}: {answer['error'].get('description', answer)}")
    if not same_filter:
        await js.add_consumer(STREAM, have.evolve(filter_subject=args.filter, filter_subjects=None))
    info: ConsumerInfo = await js.consumer_info(STREAM, args.durable)
    return info


async def read(nc: Client, args: argparse.Namespace, stop: asyncio.Event) -> None:
    js = nc.jetstream()
    await ensure_consumer(nc, args)
    sub = await js.pull_subscribe_bind(args.durable, stream=STREAM)
    seen = 0
    last_event = time.monotonic()
    stopping = asyncio.ensure_future(stop.wait())
    try:
        while not stop.is_set() and (args.max is None or seen < args.max):
            if args.idle_exit is not None and time.monotonic() - last_event >= args.idle_exit:
                return
            # One at a time: the consumer has at most one event in flight (max_ack_pending=1).
            fetching = asyncio.ensure_future(sub.fetch(1, timeout=1.0))
            await asyncio.wait({fetching, stopping}, return_when="FIRST_COMPLETED")
            if not fetching.done():  # SIGTERM during the wait: leave at once (nothing was handed to us)
                fetching.cancel()
                with contextlib.suppress(BaseException):
                    await fetching
                return
            try:
                msgs = fetching.result()
            except TimeoutError:  # nats-py's own (a subclass), or asyncio's when a batch times out part-way
                continue
            for msg in msgs:
                when = occurred_at(msg)
                if args.occurred_after is None or (when is not None and when >= args.occurred_after):
                    print(describe(msg, headers=args.headers), flush=True)
                    seen += 1
                await msg.ack()  # after the event is handled: a crash before it means it comes again
                last_event = time.monotonic()
    finally:
        stopping.cancel()


async def show_info(nc: Client) -> None:
    """The stream's state and limits: how far back a replay can go, and the largest event."""
    info = await nc.jetstream().stream_info(STREAM)
    config, state = info.config, info.state
    max_age = f"{config.max_age:.0f}s" if config.max_age else "unbounded"
    max_bytes = f"{config.max_bytes} bytes" if config.max_bytes and config.max_bytes > 0 else "unbounded"
    first = f"{state.first_seq}" if state.messages else "none"
    print(f"stream {STREAM}: {state.messages} events, first sequence {first}, last sequence {state.last_seq}")
    print(f"retention: max_age {max_age}, max_bytes {max_bytes}")
    print(f"largest event (headers and body): {nc.max_payload} bytes")


async def run(args: argparse.Namespace) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    nc = await connect(args)
    try:
        if args.info:
            await show_info(nc)
        else:
            await read(nc, args, stop)
        return 0
    finally:
        # close, not drain: every event handed to us is acknowledged, and a drain of a pull subscription
        # waits out its whole timeout (30 s) before it gives up.
        await nc.close()


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--server", default=os.environ.get("COS_NATS_URL", "nats://127.0.0.1:4222"))
    p.add_argument("--user", default=os.environ.get("COS_NATS_USER", ""))
    p.add_argument("--password", default=None, help="default: COS_NATS_PASSWORD, or the file COS_NATS_PASSWORD_FILE")
    p.add_argument("--durable", default="example-subscriber", help="this subscriber's consumer name")
    p.add_argument("--filter", default="cos.events.>", help="subjects to read, e.g. 'cos.events.acme.>'")
    start = p.add_mutually_exclusive_group()
    start.add_argument("--from-seq", type=int, metavar="N", help="a new consumer starts at stream sequence N")
    start.add_argument(
        "--from-time", type=moment, metavar="T", help="a new consumer starts at store time T (RFC 3339, or 15m ago)"
    )
    start.add_argument("--new", action="store_true", help="a new consumer reads only what comes next")
    p.add_argument(
        "--ack-wait",
        type=duration,
        default=30.0,
        metavar="S",
        help="how long an event handed out and not acknowledged (a crash) waits before it comes again (default 30s)",
    )
    p.add_argument(
        "--inactive-threshold",
        type=duration,
        default=7 * 86400.0,
        metavar="S",
        help="the server removes the consumer after this long without a reader (default 7d)",
    )
    p.add_argument("--reset", action="store_true", help="give an existing consumer this filter and start again")
    p.add_argument("--occurred-after", type=moment, metavar="T", help="skip events whose occurred_at is before T")
    p.add_argument("--max", "--count", type=int, default=None, metavar="N", help="stop after N events")
    p.add_argument("--idle-exit", type=float, default=None, metavar="S", help="stop after S seconds without events")
    p.add_argument("--headers", action="store_true", help="print each event's headers too")
    p.add_argument("--info", action="store_true", help="print the stream's size and limits, and exit")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.password is None:
        args.password = os.environ.get("COS_NATS_PASSWORD", "")
        if not args.password and os.environ.get("COS_NATS_PASSWORD_FILE"):
            with open(os.environ["COS_NATS_PASSWORD_FILE"], encoding="utf-8") as f:
                args.password = f.read().strip()
    try:
        return asyncio.run(run(args))
    except KeyboardInterrupt:
        return 0
    except Refused as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except (nats.errors.Error, OSError) as exc:
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
