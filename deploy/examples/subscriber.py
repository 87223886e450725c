"""A CommonOS event subscriber: its own durable pull consumer on COS_EVENTS, printing every event it reads.

    pip install nats-py
    COS_NATS_URL=nats://127.0.0.1:4222 COS_NATS_USER=subscriber COS_NATS_PASSWORD=… \
        python subscriber.py --durable my-service --filter 'cos.events.*.*.turn_finished'

One line per event: the stream sequence, the CloudEvents type, the subject and the event id. Each event is
acknowledged after it is printed, so a restarted subscriber goes on after the last one it acknowledged (the
consumer is durable); a crash before the acknowledgement means the event comes again: make handling idempotent
by its event id. Needs nothing but nats-py (deploy/SUBSCRIBERS.md explains the contract).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
from typing import Any
from urllib.parse import unquote

import nats
import nats.errors
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

STREAM = "COS_EVENTS"


def describe(msg: Msg) -> str:
    """`<stream seq> <ce-type> <subject> <event id>` of one delivered event."""
    headers = msg.headers or {}
    ce_type = unquote(headers.get("ce-type", "?"))
    try:
        body: Any = json.loads(msg.data)
        event_id = str(body["event_id"])
    except (ValueError, KeyError, TypeError):
        event_id = "(not an event)"
    return f"{msg.metadata.sequence.stream} {ce_type} {msg.subject} {event_id}"


async def subscribe(args: argparse.Namespace) -> int:
    nc = await nats.connect(
        [url.strip() for url in args.server.split(",")],
        user=args.user or None,
        password=args.password or None,
        name=args.durable,
        # Replies come to an inbox only this user may read (deploy/nats/auth.conf: `_INBOX_<user>.>`).
        inbox_prefix=f"_INBOX_{args.user}" if args.user else "_INBOX",
    )
    try:
        js = nc.jetstream()
        # Creates the consumer, or finds it as it was: delivery resumes after its last acknowledged event.
        await js.add_consumer(
            STREAM,
            ConsumerConfig(
                durable_name=args.durable,
                filter_subject=args.filter,
                deliver_policy=DeliverPolicy.ALL,
                ack_policy=AckPolicy.EXPLICIT,
                ack_wait=30,
                max_ack_pending=1000,
            ),
        )
        sub = await js.pull_subscribe_bind(args.durable, stream=STREAM)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        seen = 0
        while not stop.is_set() and (args.count is None or seen < args.count):
            want = 100 if args.count is None else min(100, args.count - seen)
            try:
                msgs = await sub.fetch(want, timeout=1.0)
            except nats.errors.TimeoutError:
                continue
            for msg in msgs:
                print(describe(msg), flush=True)
                await msg.ack()
                seen += 1
        return 0
    finally:
        await nc.drain()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", default=os.environ.get("COS_NATS_URL", "nats://127.0.0.1:4222"))
    parser.add_argument("--user", default=os.environ.get("COS_NATS_USER", ""))
    parser.add_argument("--password", default=os.environ.get("COS_NATS_PASSWORD", ""))
    parser.add_argument("--durable", default="example-subscriber", help="this subscriber's consumer name")
    parser.add_argument("--filter", default="cos.events.>", help="subjects to read, e.g. cos.events.acme.>")
    parser.add_argument("--count", type=int, default=None, help="stop after this many events")
    args = parser.parse_args(argv)
    try:
        return asyncio.run(subscribe(args))
    except KeyboardInterrupt:
        return 130
    except nats.errors.Error as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
