"""`cos security check`: what each NATS identity may and may not do, asked of the server itself.

Each probe publishes (or subscribes) on one subject as that identity and waits for the server's
verdict: a permissions violation, or an answer from JetStream. Probes never change anything that
exists: requests carry bodies JetStream refuses (a configuration that does not match its subject, a
message sequence that does not exist; published messages expect a stream that does not exist, so
JetStream stores none of them), and the operations that would destroy something if allowed
(deleting a stream or a consumer) are asked about a stand-in name no deployment uses, which the same
permission rules cover (the deny lists match every stream, and consumers by name).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from commonos.runtime.args import CliError, command_group
from commonos.runtime.cli_support import cli_settings
from commonos.runtime.settings import Settings

#: The identities of deploy/nats/auth.conf and the environment variables holding their passwords.
IDENTITIES: Final = {
    "loop": "NATS_LOOP_PASSWORD",
    "journal-writer": "NATS_JOURNAL_WRITER_PASSWORD",
    "billing": "NATS_BILLING_PASSWORD",
    "otlp-gateway": "NATS_OTLP_GATEWAY_PASSWORD",
    "console": "NATS_CONSOLE_PASSWORD",
    "subscriber": "NATS_SUBSCRIBER_PASSWORD",
    "admin": "NATS_ADMIN_PASSWORD",
}
STAND_IN: Final = "cos-security-probe"
_SESSION: Final = "00000000-0000-0000-0000-000000000000"
_BAD_CONFIG: Final = json.dumps({"stream_name": "COS_EVENTS", "config": {"name": "not-the-subject-s-name"}}).encode()


@dataclass(frozen=True)
class Probe:
    """One row of the matrix: what is asked, and the subject that asks it."""

    label: str
    subject: str
    body: bytes = b""
    subscribe: bool = False


PROBES: Final[tuple[Probe, ...]] = (
    Probe("publish an event", f"cos.events.{STAND_IN}.{_SESSION}.session_created", b"{}"),
    Probe("publish a dead letter", "cos.dlq.unrouted", b"{}"),
    Probe("publish a budget alert", "cos.alerts.budget", b"{}"),
    Probe("read COS_EVENTS' state (STREAM.INFO)", "$JS.API.STREAM.INFO.COS_EVENTS"),
    Probe("read one event (STREAM.MSG.GET)", "$JS.API.STREAM.MSG.GET.COS_EVENTS", b'{"seq": 18446744073709551615}'),
    Probe("read one event (DIRECT.GET)", "$JS.API.DIRECT.GET.COS_EVENTS", b'{"seq": 18446744073709551615}'),
    Probe("create COS_EVENTS (STREAM.CREATE)", "$JS.API.STREAM.CREATE.COS_EVENTS", _BAD_CONFIG),
    Probe("change COS_EVENTS (STREAM.UPDATE)", "$JS.API.STREAM.UPDATE.COS_EVENTS", _BAD_CONFIG),
    Probe("change COS_DLQ (STREAM.UPDATE)", "$JS.API.STREAM.UPDATE.COS_DLQ", _BAD_CONFIG),
    Probe("purge COS_EVENTS (STREAM.PURGE)", "$JS.API.STREAM.PURGE.COS_EVENTS", b'{"filter": "cos.none"}'),
    Probe(
        "delete an event (STREAM.MSG.DELETE)", "$JS.API.STREAM.MSG.DELETE.COS_EVENTS", b'{"seq": 18446744073709551615}'
    ),
    Probe("delete a stream (STREAM.DELETE)", f"$JS.API.STREAM.DELETE.{STAND_IN.upper().replace('-', '_')}"),
    Probe("create a consumer without naming it", "$JS.API.CONSUMER.CREATE.COS_EVENTS", _BAD_CONFIG),
    Probe(
        "create/update the journal-writer's consumer",
        "$JS.API.CONSUMER.CREATE.COS_EVENTS.journal-writer.cos.events.>",
        _BAD_CONFIG,
    ),
    Probe("create/update billing's consumer", "$JS.API.CONSUMER.DURABLE.CREATE.COS_EVENTS.billing", _BAD_CONFIG),
    Probe("create a consumer of its own name", f"$JS.API.CONSUMER.CREATE.COS_EVENTS.{STAND_IN}", _BAD_CONFIG),
    Probe("delete a consumer of another name", f"$JS.API.CONSUMER.DELETE.COS_EVENTS.{STAND_IN}"),
    Probe("write an OTLP gateway token (KV COS_OTLP_TOKENS)", f"$KV.COS_OTLP_TOKENS.{STAND_IN}", b"{}"),
    Probe("keep the OTLP call ordinals (KV COS_OTLP_STATE)", f"$KV.COS_OTLP_STATE.{STAND_IN}", b"[]"),
    Probe("ask the loop for a turn (cos.cmd.*.chat)", f"cos.cmd.{STAND_IN}.chat", b"{}"),
    Probe("answer an approval", f"cos.approvals.decide.{STAND_IN}", b"{}"),
    Probe("publish a turn's reply deltas (cos.deltas.>)", f"cos.deltas.{STAND_IN}.{_SESSION}", b"{}"),
    Probe("subscribe to the events (cos.events.>)", "cos.events.>", subscribe=True),
    Probe("subscribe to the reply deltas (cos.deltas.>)", "cos.deltas.>", subscribe=True),
    Probe("subscribe to every inbox (_INBOX.>)", "_INBOX.>", subscribe=True),
    Probe("subscribe to the subscriber's inbox (_INBOX_subscriber.>)", "_INBOX_subscriber.>", subscribe=True),
    Probe("subscribe to the loop's inbox (_INBOX_loop.>)", "_INBOX_loop.>", subscribe=True),
)


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    detail: str = ""


async def probe_identity(url: str, user: str, password: str, probes: Sequence[Probe] = PROBES) -> dict[str, Verdict]:
    """Each probe's verdict for one identity (raises CliError when it cannot log in)."""
    import nats
    import nats.errors

    from commonos.runtime.nats import inbox_prefix

    violations: list[str] = []

    async def on_error(exc: Exception) -> None:
        violations.append(str(exc).lower())

    try:
        nc = await nats.connect(
            url,
            inbox_prefix=inbox_prefix(user),
            user=user,
            password=password,
            error_cb=on_error,
            allow_reconnect=False,
            max_reconnect_attempts=0,
            connect_timeout=5,
        )
    except (nats.errors.Error, OSError) as exc:
        raise CliError(f"{user}: cannot connect to {url}: {exc}") from None
    verdicts: dict[str, Verdict] = {}
    try:
        for probe in probes:
            seen = len(violations)
            if probe.subscribe:
                sub = await nc.subscribe(probe.subject)
                await nc.flush(timeout=5)
                await _settle()
                await sub.unsubscribe()
                denied = any("subscription" in v for v in violations[seen:])
            else:
                reply = nc.new_inbox()
                answers = await nc.subscribe(reply, max_msgs=1)
                # A stream that does not exist is expected: JetStream stores nothing a probe publishes.
                await nc.publish(probe.subject, probe.body, reply=reply, headers={"Nats-Expected-Stream": STAND_IN})
                await nc.flush(timeout=5)
                await _settle()
                denied = any("publish" in v for v in violations[seen:])
                await answers.unsubscribe()
            verdicts[probe.label] = Verdict(not denied)
    finally:
        await nc.close()
    return verdicts


async def _settle() -> None:
    # The server reports a violation before it answers the PING of `flush`; the error callback runs as a
    # task of its own, so give it a turn of the loop.
    for _ in range(10):
        await asyncio.sleep(0.005)


def matrix_markdown(results: dict[str, dict[str, Verdict]]) -> str:
    """A table: one row per probe, one column per identity, `yes`/`no`."""
    users = list(results)
    lines = ["| may … | " + " | ".join(f"`{u}`" for u in users) + " |", "|---" * (len(users) + 1) + "|"]
    for probe in PROBES:
        cells = ["yes" if results[u][probe.label].allowed else "no" for u in users]
        lines.append(f"| {probe.label} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _identities(args: argparse.Namespace, settings: Settings) -> dict[str, str]:
    """--identity USER=PASSWORD; else auth.conf's password variables; else the secrets `cos up` keeps."""
    from commonos.runtime.system import secret_path

    chosen: dict[str, str] = {}
    for item in args.identity or []:
        user, sep, password = item.partition("=")
        if not sep or not user:
            raise CliError(f"--identity {item!r}: give USER=PASSWORD")
        chosen[user] = password
    if not chosen:
        chosen = {user: os.environ[var] for user, var in IDENTITIES.items() if os.environ.get(var)}
    if not chosen:
        for user in IDENTITIES:
            path = secret_path(settings, f"nats-{user}")
            if path.is_file():
                chosen[user] = path.read_text(encoding="utf-8").strip()
    if not chosen:
        raise CliError(
            "no identity to check: pass --identity USER=PASSWORD, set the variables auth.conf reads "
            f"({', '.join(IDENTITIES.values())}), or run it beside a `cos up` (COS_DATA_DIR)"
        )
    return chosen


def _server(settings: Settings) -> str:
    """COS_NATS_URL, else the `cos up` system's, without any login in it (each identity logs in itself)."""
    from urllib.parse import urlsplit, urlunsplit

    url = cli_settings(settings, database=False).nats_url or ""
    parts = [urlsplit(u.strip()) for u in url.split(",")]
    return ",".join(urlunsplit(p._replace(netloc=p.netloc.rpartition("@")[2])) for p in parts)


def _check(args: argparse.Namespace) -> int:
    settings = Settings.from_env()
    url = _server(settings)

    identities = _identities(args, settings)

    async def run() -> dict[str, dict[str, Verdict]]:
        return {user: await probe_identity(url, user, pw) for user, pw in identities.items()}

    results = asyncio.run(run())
    if args.format == "json":
        print(json.dumps({u: {k: v.allowed for k, v in r.items()} for u, r in results.items()}, indent=2))
    else:
        print(matrix_markdown(results), end="")
    return 0


def register(sub: Any) -> None:
    security_sub = command_group(sub, "security", "check what each NATS identity may do", __doc__)
    check = security_sub.add_parser(
        "check",
        help="connect as each identity and print what it may and may not do",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    check.add_argument(
        "--identity",
        action="append",
        metavar="USER=PASSWORD",
        help="an identity to check (repeatable); default: the users of deploy/nats/auth.conf whose password "
        "variable (NATS_LOOP_PASSWORD, ...) is set, else those of the `cos up` in COS_DATA_DIR",
    )
    check.add_argument("--format", choices=("table", "json"), default="table")
    check.set_defaults(handler=_check)
