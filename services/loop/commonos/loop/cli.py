"""`cos chat`, `cos loop serve`, `cos approve ID`, `cos deny ID`.

`cos chat` sends each turn to the loop service (`cos.cmd.<profile>.chat`); where no service answers
(or with `--local`) it runs the turn in this process on the same NATS. While a turn runs it prints
each approval request of the profile as it starts to wait: the tool and its arguments, how to decide
(`cos approve ID` / `cos deny ID` from any shell, or the console's Approvals page when it knows where
the console is) and until when; then how it was decided, or that nobody decided in time and the call
was not run. With `--yes` it approves them itself.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import getpass
import os
import sys
import uuid
from typing import Any

import msgspec
import nats.errors
from nats.aio.client import Client
from nats.aio.msg import Msg

from commonos.proto.events import (
    ApprovalDecided,
    ApprovalStatus,
    EventDecodeError,
    ToolCallRecorded,
    decode_event,
    utcnow,
)
from commonos.proto.requests import (
    ApprovalRequest,
    ChatReply,
    ChatRequest,
    approval_request_subject,
    chat_subject,
    check_approver,
)
from commonos.proto.subjects import EVENTS_PREFIX
from commonos.proto.tags import InvalidTag, parse_tag
from commonos.runtime import nats as cos_nats
from commonos.runtime.args import CliError, command_group
from commonos.runtime.cli_support import cli_connect, cli_settings
from commonos.runtime.lifecycle import run
from commonos.runtime.loop_requests import send_decision
from commonos.runtime.settings import Settings
from commonos.runtime.system import running_state


def _uuid(raw: str) -> uuid.UUID:
    try:
        return uuid.UUID(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{raw!r} is not a UUID") from None


def _tag(raw: str) -> str:
    try:
        return parse_tag(raw)
    except InvalidTag as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _who() -> str:
    try:
        return f"cli:{getpass.getuser()}"
    except (KeyError, OSError):
        return "cli:unknown"


# -- cos approve / cos deny -----------------------------------------------------------------------


def _decide(args: argparse.Namespace, status: ApprovalStatus) -> int:
    settings = cli_settings(database=False)

    async def main() -> int:
        try:
            approver = check_approver(args.by or _who())
        except ValueError as exc:
            raise CliError(f"--by: {exc}") from None
        nc = await cli_connect(settings, "cos-approve")
        try:
            ack = await send_decision(nc, args.profile, args.id, status, approver)
        finally:
            await nc.close()
        if not ack.ok:
            raise CliError(ack.error or "the decision was not taken")
        print(f"{status.value} {args.id}")
        return 0

    return run(main)


def _approve(args: argparse.Namespace) -> int:
    return _decide(args, ApprovalStatus.APPROVED)


def _deny(args: argparse.Namespace) -> int:
    return _decide(args, ApprovalStatus.DENIED)


# -- cos loop serve -------------------------------------------------------------------------------


def serve_command(args: argparse.Namespace) -> int:
    from commonos.loop.service import DEFAULT_HTTP_PORT, serve

    settings = cli_settings(database=False, http_port=DEFAULT_HTTP_PORT)
    return run(lambda: serve(settings))


# -- cos chat -------------------------------------------------------------------------------------


def _console_approvals_url(settings: Settings) -> str | None:
    """Where a person decides on the console: its public origin (the first of COS_CONSOLE_ORIGINS, the console's
    own setting), else the console of the `cos up` running in COS_DATA_DIR; None when neither is known."""
    origins = [o.strip().rstrip("/") for o in os.environ.get("COS_CONSOLE_ORIGINS", "").split(",") if o.strip()]
    if origins:
        return f"{origins[0]}/approvals"
    try:
        state = running_state(settings)
    except CliError:
        return None
    port = (state or {}).get("http_ports", {}).get("console")
    if not port:
        return None
    host = os.environ.get("COS_CONSOLE_HOST", "").strip() or "127.0.0.1"
    shown = "127.0.0.1" if host in {"0.0.0.0", "::", "localhost"} else f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}/approvals"


def _call(request: ApprovalRequest) -> str:
    args = msgspec.json.encode(request.args).decode()
    return f"{request.tool} {args if len(args) <= 200 else args[:200] + '…'}"


class _Chat:
    def __init__(self, nc: Client, settings: Settings, args: argparse.Namespace) -> None:
        self.nc = nc
        self.settings = settings
        self.profile: str = args.profile
        self.session: uuid.UUID | None = args.session
        self.tags: tuple[str, ...] = tuple(args.tag)
        self.auto_approve: bool = args.yes
        self.local: bool = args.local
        self.timeout_s: float = args.timeout
        self.verbose: bool = args.verbose
        self._local_loop: Any = None
        #: The approvals this command told of, until it has said how each was decided.
        self.told: dict[uuid.UUID, ApprovalRequest] = {}

    async def on_approval_request(self, msg: Msg) -> None:
        try:
            request = msgspec.json.decode(msg.data, type=ApprovalRequest)
        except msgspec.DecodeError:
            return
        call = _call(request)
        self.told[request.approval_id] = request
        if self.auto_approve:
            ack = await send_decision(self.nc, request.profile_id, request.approval_id, ApprovalStatus.APPROVED, _who())
            if not ack.ok:
                print(f"[could not approve {call}: {ack.error}]", file=sys.stderr, flush=True)
            return
        which = f"--profile {request.profile_id} {request.approval_id}"
        left = (request.expires_at - utcnow()).total_seconds()
        lines = [
            f"[waiting for approval: {call}]",
            f"  approve: cos approve {which}",
            f"  deny:    cos deny {which}",
        ]
        console = None if self.local else _console_approvals_url(self.settings)
        if console is not None:
            lines.append(f"  or on the console: {console}")
        lines.append(
            f"  unanswered by {request.expires_at:%H:%M:%S} UTC (in {max(left, 0):.0f} s), it is denied and not run"
        )
        print("\n".join(lines), file=sys.stderr, flush=True)

    async def on_decision(self, msg: Msg) -> None:
        try:
            event = decode_event(msg.data)
        except EventDecodeError:
            return
        if not isinstance(event, ApprovalDecided):
            return
        request = self.told.pop(event.tool_call_id, None)
        if request is None:
            return  # not one this command told of (a policy's decision, another profile's)
        call = _call(request)
        if event.status is ApprovalStatus.TIMED_OUT:
            said = (
                f"[approval expired at {event.decided_at:%H:%M:%S} UTC: nobody decided on {call} in time; "
                "it was not run]"
            )
        elif event.status is ApprovalStatus.APPROVED:
            said = f"[approved by {event.decided_by}: {call}; running it]"
        else:
            said = f"[denied by {event.decided_by}: {call}; it was not run]"
        print(said, file=sys.stderr, flush=True)

    async def on_tool_call(self, msg: Msg) -> None:
        try:
            event = decode_event(msg.data)
        except EventDecodeError:
            return
        if isinstance(event, ToolCallRecorded):
            result = (event.result or "").strip().splitlines()
            first = result[0][:100] if result else ""
            args = msgspec.json.encode(event.args).decode()
            print(f"[{event.name} {args} → {first}{' …' if len(result) > 1 else ''}]", file=sys.stderr)

    async def turn(self, text: str) -> int:
        # A session's tags are given when it starts: the first turn of a conversation brings them, the
        # turns that continue it do not.
        tags = self.tags if self.session is None else ()
        request = ChatRequest(text=text, session_id=self.session, tags=tags, source="cli")
        watch = (
            await self.nc.subscribe(f"{EVENTS_PREFIX}.{self.profile}.*.tool_call_recorded", cb=self.on_tool_call)
            if self.verbose
            else None
        )
        try:
            reply = await (self._run_here(request) if self.local else self._ask_service(request))
        finally:
            if watch is not None:
                with contextlib.suppress(nats.errors.Error):
                    await watch.unsubscribe()
        if reply.session_id is not None and self.session is None:
            self.session = reply.session_id
            print(f"[session {reply.session_id}]", file=sys.stderr)
        if reply.text:
            print(reply.text, flush=True)
        if reply.status != "completed":
            print(f"[turn {reply.status}: {reply.error or 'no answer'}]", file=sys.stderr)
            return 1
        return 0

    async def _ask_service(self, request: ChatRequest) -> ChatReply:
        try:
            msg = await self.nc.request(
                chat_subject(self.profile), msgspec.json.encode(request), timeout=self.timeout_s
            )
        except nats.errors.NoRespondersError:
            print(f"[no loop service answers for profile {self.profile!r}; running the turn here]", file=sys.stderr)
            self.local = True
            return await self._run_here(request)
        except nats.errors.TimeoutError:
            raise CliError(f"no reply within {self.timeout_s:.0f}s (the turn may still be running)") from None
        return msgspec.json.decode(msg.data, type=ChatReply)

    async def _run_here(self, request: ChatRequest) -> ChatReply:
        from commonos.loop.approvals import NatsApprover
        from commonos.loop.event_journal import LOOP_SOURCE
        from commonos.loop.journal import MessageTooLarge, SessionNotFound
        from commonos.loop.locks import NatsSessionLocks, SessionBusy
        from commonos.loop.loop import BadRequest, Loop, TurnRequest, UnknownProfile
        from commonos.loop.nats_journal import NatsJournal
        from commonos.loop.profiles import ProfileError, load_profiles
        from commonos.loop.providers import build_provider
        from commonos.proto.profiles import describe_deletion
        from commonos.runtime.publisher import EventPublisher

        if self._local_loop is None:
            try:
                profiles = load_profiles(self.settings.profiles_dir)
                profile = profiles.get(self.profile)
                if profile is None:
                    raise CliError(f"no profile {self.profile!r} in {self.settings.profiles_dir}")
                provider = build_provider(profile)
            except ProfileError as exc:
                raise CliError(str(exc)) from None
            js = self.nc.jetstream()
            await cos_nats.ensure_streams(js, self.settings.stream_replicas)
            publisher = EventPublisher(js, LOOP_SOURCE, nc=self.nc)
            journal = NatsJournal(js, publisher, max_message_bytes=self.settings.max_message_bytes)
            deleted = (await journal.profile_status(profile.id)).deleted
            if deleted is not None:  # it stays deleted: publishing it would re-create it
                raise CliError(f"{describe_deletion(deleted)}: it takes no chats")
            await journal.publish_profile(profile.id, profile.tags)
            try:
                self._local_loop = Loop(
                    journal,
                    {profile.id: profile},
                    {profile.id: provider},
                    locks=NatsSessionLocks(js, replicas=self.settings.stream_replicas),
                    approver=NatsApprover(self.nc),
                )
            except ProfileError as exc:  # a hook that cannot be loaded
                raise CliError(str(exc)) from None
        loop: Loop = self._local_loop
        try:
            result = await loop.run_turn(
                TurnRequest(
                    profile_id=self.profile,
                    text=request.text,
                    session_id=request.session_id,
                    tags=request.tags,
                    source="cli",
                )
            )
        except (BadRequest, InvalidTag, SessionBusy, SessionNotFound, UnknownProfile, MessageTooLarge) as exc:
            raise CliError(str(exc)) from None
        return ChatReply(
            status=result.status.value,
            session_id=result.session_id,
            turn_id=result.turn_id,
            text=result.text,
            error=result.error,
        )

    async def close(self) -> None:
        if self._local_loop is not None:
            for provider in self._local_loop.providers.values():
                await provider.close()


def _chat(args: argparse.Namespace) -> int:
    if args.session is not None and args.tag:
        raise CliError(
            "--tag is for a new session: a session's tags are fixed when it starts "
            f"(leave out --tag to continue session {args.session})"
        )
    settings = cli_settings(database=False)
    text = " ".join(args.text).strip()

    async def main() -> int:
        nc = await cli_connect(settings, "cos-chat")
        chat = _Chat(nc, settings, args)
        subs = [
            await nc.subscribe(approval_request_subject(args.profile), cb=chat.on_approval_request),
            await nc.subscribe(f"{EVENTS_PREFIX}.{args.profile}.*.approval_decided", cb=chat.on_decision),
        ]
        try:
            if text:
                return await chat.turn(text)
            print(f"Chatting with profile {args.profile!r}; an empty line or Ctrl-D ends.", file=sys.stderr)
            code = 0
            while True:
                try:
                    line = (await asyncio.to_thread(input, "you> ")).strip()
                except EOFError:
                    break
                if not line:
                    break
                code = await chat.turn(line)
            return code
        finally:
            for sub in subs:
                with contextlib.suppress(nats.errors.Error):
                    await sub.unsubscribe()
            await chat.close()
            await nc.close()

    return run(main)


def register(sub: Any) -> None:
    chat = sub.add_parser(
        "chat",
        help="talk to a profile: one turn for TEXT, or a conversation when no TEXT is given",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    chat.add_argument("--profile", default="default", help="profile id (default: default)")
    chat.add_argument("--session", type=_uuid, help="continue this session")
    chat.add_argument(
        "--tag", type=_tag, action="append", default=[], help="tag of a new session (key:value, at most 256 characters)"
    )
    chat.add_argument("--yes", action="store_true", help="approve every risky tool call of the profile while waiting")
    chat.add_argument("--local", action="store_true", help="run turns in this process, not the loop service")
    chat.add_argument("-v", "--verbose", action="store_true", help="show the tool calls of the profile as they run")
    chat.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for a turn (default 600)")
    chat.add_argument("text", nargs="*", help="the message; without it, a conversation on stdin")
    chat.set_defaults(handler=_chat)

    loop_sub = command_group(sub, "loop", "the agent loop service", metavar="COMMAND", required=False)
    serve = loop_sub.add_parser("serve", help="answer chat requests on NATS until SIGTERM")
    serve.set_defaults(handler=serve_command)

    for name, handler, verb in (("approve", _approve, "run"), ("deny", _deny, "not run")):
        p = sub.add_parser(name, help=f"let a waiting risky tool call {verb}")
        p.add_argument("id", type=_uuid, help="the approval id printed with the request")
        p.add_argument(
            "--profile",
            default=os.environ.get("COS_PROFILE", "default"),
            help="the profile whose call it is, printed with the request (default $COS_PROFILE or default)",
        )
        p.add_argument(
            "--by",
            help="who decides, one name (default cli:<user>); with NATS permissions, the name your user may answer as",
        )
        p.set_defaults(handler=handler)
