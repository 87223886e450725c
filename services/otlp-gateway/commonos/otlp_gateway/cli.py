"""cos otlp: the OTLP/HTTP gateway (serve) and its bearer tokens (token create, list, revoke).

    cos otlp serve [--host H] [--port 4318] [--max-body-bytes N] [--tag-attributes client,project,team]
    cos otlp token create --profile P [--name N] [--tag K:V ...] [--tag-keys K,...]   prints the token, once
    cos otlp token list [--format table|json]
    cos otlp token revoke NAME

The token commands talk to COS_NATS_URL, or the NATS of the `cos up` running in COS_DATA_DIR (as its admin).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
from typing import Any

from commonos.runtime.args import CliError, command_group
from commonos.runtime.cli_support import cli_jetstream, cli_settings
from commonos.runtime.settings import Settings


def _serve(args: argparse.Namespace) -> int:
    overrides = {
        "COS_OTLP_HOST": args.host,
        "COS_OTLP_PORT": None if args.port is None else str(args.port),
        "COS_OTLP_GRPC_PORT": None if args.grpc_port is None else str(args.grpc_port),
        "COS_OTLP_MAX_BODY_BYTES": None if args.max_body_bytes is None else str(args.max_body_bytes),
        "COS_OTLP_TAG_ATTRIBUTES": args.tag_attributes,
    }
    for name, value in overrides.items():
        if value is not None:
            os.environ[name] = value
    from commonos.otlp_gateway.service import main

    return main()


def _tag(raw: str) -> str:
    from commonos.proto.tags import InvalidTag, parse_tag

    try:
        return parse_tag(raw)
    except InvalidTag as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _tag_keys(raw: str) -> tuple[str, ...]:
    from commonos.otlp_gateway.auth import check_tag_key
    from commonos.proto.tags import InvalidTag

    try:
        return tuple(check_tag_key(k.strip()) for k in raw.split(",") if k.strip())
    except InvalidTag as exc:
        raise argparse.ArgumentTypeError(f"not a tag key: {exc}") from None


def _profile(raw: str) -> str:
    from commonos.proto.tags import InvalidProfileId, check_profile_id

    try:
        return check_profile_id(raw)
    except InvalidProfileId as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


async def _with_bucket(work: Any) -> Any:
    from commonos.otlp_gateway.auth import tokens_bucket

    settings = cli_settings(Settings.from_env(), database=False)
    async with cli_jetstream(settings, "cos-otlp", ensure_streams=False) as (_, js):
        kv = await tokens_bucket(js, settings.stream_replicas)
        return await work(kv)


def _create(args: argparse.Namespace) -> int:
    from commonos.otlp_gateway.auth import TokenError, create_token

    async def work(kv: Any) -> Any:
        try:
            return await create_token(kv, args.profile, args.name, tags=args.tag, tag_keys=args.tag_keys)
        except TokenError as exc:
            raise CliError(str(exc)) from None

    token, info = asyncio.run(_with_bucket(work))
    print(token)
    import sys

    print(
        f"token {info.name!r} of profile {info.profile_id!r}: shown once, only its SHA-256 is kept. Send it as\n"
        f'  OTEL_EXPORTER_OTLP_HEADERS="Authorization=Bearer {token}"',
        file=sys.stderr,
    )
    return 0


def _list(args: argparse.Namespace) -> int:
    from commonos.otlp_gateway.auth import list_tokens

    tokens = asyncio.run(_with_bucket(list_tokens))
    if args.format == "json":
        print(json.dumps([{**dataclasses.asdict(t), "digest": t.digest[:12]} for t in tokens], indent=2))
        return 0
    if not tokens:
        print("no tokens (cos otlp token create --profile P)")
        return 0
    width = max(len(t.name) for t in tokens)
    print(f"{'name':<{width}}  {'profile':<20}  {'created_at':<25}  {'sha256':<12}  tags (senders may set)")
    for t in tokens:
        keys = "any" if t.tag_keys is None else (",".join(t.tag_keys) or "none")
        tags = f"{','.join(t.tags) or '-'} ({keys})"
        print(f"{t.name:<{width}}  {t.profile_id:<20}  {t.created_at:<25}  {t.digest[:12]:<12}  {tags}")
    return 0


def _revoke(args: argparse.Namespace) -> int:
    from commonos.otlp_gateway.auth import TokenError, revoke_token

    async def work(kv: Any) -> Any:
        try:
            return await revoke_token(kv, args.name)
        except TokenError as exc:
            raise CliError(str(exc)) from None

    for info in asyncio.run(_with_bucket(work)):
        print(f"revoked {info.name!r} (profile {info.profile_id!r})")
    return 0


def register(sub: Any) -> None:
    otlp_sub = command_group(
        sub, "otlp", "the OTLP gateway: OpenTelemetry in (serve), its bearer tokens (token)", __doc__
    )
    serve = otlp_sub.add_parser(
        "serve",
        help="run the OTLP gateway (OTLP/gRPC and OTLP/HTTP) in the foreground",
        description="Receive OTLP/gRPC (the collector's trace, logs and metrics services, gzip or not) and OTLP/HTTP "
        "(POST /v1/traces, /v1/logs, /v1/metrics; protobuf or JSON, gzip or not) and publish it as events, "
        "answering OK only once JetStream stored them (503 with Retry-After, gRPC's UNAVAILABLE with RetryInfo, while "
        "NATS is unavailable). Every request needs a profile's bearer token (cos otlp token create). Options "
        "override their COS_OTLP_* variables; /metrics /healthz /readyz are on COS_HTTP_PORT (default 9464).",
    )
    serve.add_argument("--host", help="address to listen on (COS_OTLP_HOST, default 127.0.0.1; 0.0.0.0 for all)")
    serve.add_argument("--port", type=int, help="OTLP/HTTP port (COS_OTLP_PORT, default 4318)")
    serve.add_argument("--grpc-port", type=int, help="OTLP/gRPC port (COS_OTLP_GRPC_PORT, default 4317)")
    serve.add_argument(
        "--max-body-bytes",
        type=int,
        help="largest body, as sent and once inflated: 413 above (COS_OTLP_MAX_BODY_BYTES, default 16 MiB)",
    )
    serve.add_argument(
        "--tag-attributes",
        metavar="KEYS",
        help="comma-separated resource attribute keys that become tags, client=acme -> client:acme "
        "(COS_OTLP_TAG_ATTRIBUTES, default client,project,team; cos.tag.<key> attributes always do; '' for none)",
    )
    serve.set_defaults(handler=_serve)

    token_sub = command_group(
        otlp_sub, "token", "create, list and revoke the gateway's bearer tokens", metavar="ACTION"
    )
    create = token_sub.add_parser(
        "create",
        help="make a token for a profile and print it (once)",
        description="Print a new bearer token of PROFILE on stdout (only its SHA-256 is kept: it cannot be shown "
        "again). The profile need not exist yet: its first session creates it.",
    )
    create.add_argument("--profile", required=True, type=_profile, help="the profile the telemetry belongs to")
    create.add_argument("--name", help="a name to list and revoke it by (default: <profile>-<8 hex>)")
    create.add_argument(
        "--tag",
        action="append",
        default=[],
        type=_tag,
        help="a tag every event of the token carries (repeat for more); a sender's other value of its key is left out",
    )
    create.add_argument(
        "--tag-keys",
        type=_tag_keys,
        help="the only tag keys the token's senders may set through resource attributes (comma-separated; '' for "
        "none); others are left out and named in the partial success (default: any)",
    )
    create.set_defaults(handler=_create)
    lst = token_sub.add_parser("list", help="the tokens (names, profiles, creation times; never the tokens)")
    lst.add_argument("--format", choices=("table", "json"), default="table")
    lst.set_defaults(handler=_list)
    revoke = token_sub.add_parser("revoke", help="revoke a token by name: every gateway refuses it within a second")
    revoke.add_argument("name", help="the token's name (cos otlp token list)")
    revoke.set_defaults(handler=_revoke)


__all__ = ["register"]
