"""Cost by tag from the priced-call events alone: reads COS_COSTS from its first event and sums them.

    pip install nats-py
    eval "$(cos env --user subscriber)"      # COS_NATS_URL, COS_NATS_USER, COS_NATS_PASSWORD
    python costs.py --idle-exit 5            # read everything there is, print the totals, exit
    python costs.py --json --idle-exit 5     # the same as one JSON object (amounts as exact strings)

Billing publishes one `model_call_priced` event per priced call and one more for every reprice that changes a
call (deploy/SUBSCRIBERS.md, "Priced calls"). Each carries `cost_delta_usd`, what it changes the call's cost
by: summing those, each `event_id` once (a republish after a crash carries the same id), gives what `cos
report cost` gives, in total and by tag, whatever order the events come in. A call with several tags counts
in each of them, so the tags' amounts may add up to more than the total.

The reader is a consumer of its own, made for this run (no acknowledgements; the server removes it a minute
after the run ends): a restart reads the stream from the start again, so nothing is kept between runs.
`--filter 'cos.costs.<profile>.priced'` reads one profile's calls. It stops on SIGTERM or Ctrl-C, or after
`--idle-exit S` seconds without an event, and then prints the totals.

Exit status: 0 stopped as asked, 1 an error (one line on stderr), 2 bad arguments. Needs nothing but nats-py.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time
import uuid
from collections import defaultdict
from decimal import Decimal
from typing import Any

import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

STREAM = "COS_COSTS"
CONNECT_TIMEOUT_S = 10.0


class Refused(Exception):
    """What the reader will not do, said in one line."""


class Totals:
    """Sums of `cost_delta_usd`, in total and by tag, each event id counted once."""

    def __init__(self) -> None:
        self.seen: set[str] = set()
        self.calls: set[str] = set()
        self.total = Decimal(0)
        self.by_tag: dict[str, Decimal] = defaultdict(Decimal)
        self.duplicates = 0

    def add(self, event: dict[str, Any]) -> None:
        if event.get("type") != "model_call_priced":
            return  # a type this reader does not know (a newer one): not a cost it can sum
        if event["event_id"] in self.seen:
            self.duplicates += 1
            return
        self.seen.add(event["event_id"])
        self.calls.add(event["call_id"])
        delta = Decimal(event["cost_delta_usd"])
        self.total += delta
        for tag in event["tags"]:
            self.by_tag[tag] += delta

    def as_json(self) -> str:
        return json.dumps(
            {
                "events": len(self.seen),
                "calls": len(self.calls),
                "duplicates_dropped": self.duplicates,
                "total_usd": str(self.total),
                "by_tag_usd": {tag: str(usd) for tag, usd in sorted(self.by_tag.items())},
            },
            indent=2,
        )

    def as_table(self) -> str:
        width = max([len("tag"), *(len(t) for t in self.by_tag)])
        lines = [f"{'tag':<{width}}  {'usd':>16}"]
        for tag, usd in sorted(self.by_tag.items(), key=lambda item: (-item[1], item[0])):
            lines.append(f"{tag:<{width}}  {usd:>16.6f}")
        lines.append(f"{'total':<{width}}  {self.total:>16.6f}")
        lines.append(f"{len(self.calls)} calls, {len(self.seen)} events ({self.duplicates} republished copies dropped)")
        return "\n".join(lines)


async def connect(args: argparse.Namespace) -> Client:
    """Connect, or fail with one line within CONNECT_TIMEOUT_S (bad credentials, a server down)."""
    options: dict[str, Any] = {
        "servers": [url.strip() for url in args.server.split(",")],
        "name": "cos-costs-example",
        "connect_timeout": 3,
        "allow_reconnect": False,
        # Replies come to an inbox only this user may read (deploy/nats/auth.conf: `_INBOX_<user>.>`).
        "inbox_prefix": f"_INBOX_{args.user}" if args.user else "_INBOX",
    }
    if args.user:
        options |= {"user": args.user, "password": args.password}

    async def quiet(_: Exception) -> None:
        return None

    try:
        return await asyncio.wait_for(nats.connect(error_cb=quiet, **options), CONNECT_TIMEOUT_S)
    except (TimeoutError, nats.errors.Error, OSError) as exc:
        if "authorization" in str(exc).lower():
            raise Refused("authorization violation: check COS_NATS_USER/COS_NATS_PASSWORD") from None
        raise Refused(f"cannot reach NATS at {args.server}: {type(exc).__name__} {exc} (check COS_NATS_URL)") from None


async def read(nc: Client, args: argparse.Namespace, totals: Totals, stop: asyncio.Event) -> None:
    js = nc.jetstream()
    name = f"costs-{uuid.uuid4().hex[:12]}"
    await js.add_consumer(
        STREAM,
        ConsumerConfig(
            name=name,
            filter_subject=args.filter,
            deliver_policy=DeliverPolicy.ALL,
            ack_policy=AckPolicy.NONE,
            # This run's consumer: the server removes it once nobody has read from it for a minute.
            inactive_threshold=60.0,
        ),
    )
    sub = await js.pull_subscribe_bind(name, stream=STREAM)
    last_event = time.monotonic()
    while not stop.is_set():
        if args.idle_exit is not None and time.monotonic() - last_event >= args.idle_exit:
            return
        try:
            msgs = await sub.fetch(500, timeout=1.0)
        except TimeoutError:
            continue
        for msg in msgs:
            totals.add(json.loads(msg.data))
        if msgs:
            last_event = time.monotonic()


async def run(args: argparse.Namespace) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    nc = await connect(args)
    totals = Totals()
    try:
        await read(nc, args, totals, stop)
    except nats.js.errors.NotFoundError:
        raise Refused(f"no stream {STREAM}: billing creates it (`cos streams ensure` as admin)") from None
    finally:
        await nc.close()
    print(totals.as_json() if args.json else totals.as_table(), flush=True)
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--server", default=os.environ.get("COS_NATS_URL", "nats://127.0.0.1:4222"))
    p.add_argument("--user", default=os.environ.get("COS_NATS_USER", ""))
    p.add_argument("--password", default=None, help="default: COS_NATS_PASSWORD, or the file COS_NATS_PASSWORD_FILE")
    p.add_argument("--filter", default="cos.costs.>", help="subjects to read, e.g. 'cos.costs.acme.priced'")
    p.add_argument("--idle-exit", type=float, default=None, metavar="S", help="stop after S seconds without events")
    p.add_argument("--json", action="store_true", help="print the totals as JSON (amounts as exact strings)")
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
