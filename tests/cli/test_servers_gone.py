"""Every `cos` command that talks to NATS or PostgreSQL answers within 10 s, in one line naming the server and with
a non-zero exit, when that server is gone (killed: nothing listens on its port any more) or frozen (SIGSTOP: its
port accepts connections, nothing answers).

The commands run as the user runs them, one process each, against a real nats-server and PostgreSQL of the
harness; only the server named is gone, the other one is there.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from commonos.runtime.embedded import NatsServer, free_port
from tests.harness import PgServer

REPO = Path(__file__).resolve().parents[2]
#: A Claude Code transcript, for `cos import` to have something to publish.
TRANSCRIPTS = REPO / "tests/fixtures/clients/claude-code-2.1.332/resume/claude"
#: The most a command may take to say that its server is gone.
ANSWER_WITHIN_S = 10.0
SOME_ID = str(uuid.uuid4())

#: Every command that needs NATS (some need PostgreSQL too, which is there).
NATS_COMMANDS: dict[str, list[str]] = {
    "status": ["status"],
    "status json": ["status", "--format", "json"],
    "chat": ["chat", "hello"],
    "approve": ["approve", SOME_ID],
    "deny": ["deny", SOME_ID],
    "dlq list": ["dlq", "list"],
    "dlq replay": ["dlq", "replay", "--all"],
    "replay": ["replay"],
    "streams ensure": ["streams", "ensure"],
    "otlp token list": ["otlp", "token", "list"],
    "otlp token create": ["otlp", "token", "create", "--profile", "default"],
    "otlp token revoke": ["otlp", "token", "revoke", "nobody"],
    "profile list": ["profile", "list"],
    "profile delete": ["profile", "delete", "someone", "--yes"],
    "profile recreate": ["profile", "recreate", "someone"],
    "import": ["import", "claude", "TRANSCRIPTS", "--no-progress", "--jobs", "1"],
}
#: Every command that needs PostgreSQL (and NATS, which is there, when it needs it).
POSTGRES_COMMANDS: dict[str, list[str]] = {
    "status": ["status"],
    "report cost": ["report", "cost"],
    "billing reprice": ["billing", "reprice", "--since", "2020-01-01"],
    "billing rebuild-days": ["billing", "rebuild-days"],
    "replay": ["replay"],
}


@dataclass
class Answer:
    argv: list[str]
    code: int | None
    out: str
    err: str
    seconds: float

    @property
    def said(self) -> list[str]:
        return [line for line in (self.out + self.err).splitlines() if line.strip()]


def run_cos(argv: list[str], env: dict[str, str], transcripts: Path) -> Answer:
    argv = [str(transcripts) if a == "TRANSCRIPTS" else a for a in argv]
    started = time.monotonic()
    try:
        done = subprocess.run(
            [sys.executable, "-m", "commonos.cli.main", *argv],
            env=env,
            capture_output=True,
            text=True,
            timeout=ANSWER_WITHIN_S + 20,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired as exc:
        return Answer(argv, None, str(exc.stdout or ""), str(exc.stderr or ""), time.monotonic() - started)
    return Answer(argv, done.returncode, done.stdout, done.stderr, time.monotonic() - started)


def run_all(commands: dict[str, list[str]], env: dict[str, str], transcripts: Path) -> dict[str, Answer]:
    # Two at a time: each is a Python start (about a second of CPU) on a 2-core machine.
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {name: pool.submit(run_cos, argv, env, transcripts) for name, argv in commands.items()}
        return {name: future.result() for name, future in futures.items()}


def check(answers: dict[str, Answer], server: str) -> None:
    wrong = []
    for name, a in answers.items():
        if a.code is None:
            wrong.append(f"cos {name}: no answer after {a.seconds:.0f} s")
        elif a.seconds > ANSWER_WITHIN_S:
            wrong.append(f"cos {name}: answered after {a.seconds:.1f} s (more than {ANSWER_WITHIN_S:.0f}): {a.said}")
        elif a.code == 0:
            wrong.append(f"cos {name}: exit 0: {a.said}")
        elif not a.said or not any(server in line for line in a.said):
            wrong.append(f"cos {name}: nothing names {server}: {a.said}")
        elif any("Traceback" in line for line in a.said):
            wrong.append(f"cos {name}: a traceback: {a.said}")
        elif len(a.said) != 1 and a.argv[0] != "status":
            wrong.append(f"cos {name}: {len(a.said)} lines: {a.said}")
    assert not wrong, "\n".join(wrong)


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """No `cos up` to fall back on, and no NATS identity of the caller's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("COS_")}
    env["COS_DATA_DIR"] = str(tmp_path / "no-cos-up")
    env["COS_PROFILES_DIR"] = str(tmp_path / "profiles")
    env["COS_LOG_LEVEL"] = "WARNING"
    return env


@pytest.fixture
def transcripts(tmp_path: Path) -> Path:
    copy = tmp_path / "claude"
    shutil.copytree(TRANSCRIPTS, copy)
    return copy


@pytest.fixture
def gone_nats(server_root: Path) -> Iterator[str]:
    """The URL of a nats-server killed with SIGKILL."""
    server = NatsServer(server_root / f"nats-gone-{uuid.uuid4().hex[:8]}").start()
    url = server.url
    server.kill()
    yield url


@pytest.fixture
def frozen_nats(server_root: Path) -> Iterator[str]:
    """The URL of a nats-server stopped with SIGSTOP: its port takes connections, it answers nothing."""
    server = NatsServer(server_root / f"nats-frozen-{uuid.uuid4().hex[:8]}").start()
    assert server.pid is not None
    os.kill(server.pid, signal.SIGSTOP)
    yield server.url
    os.kill(server.pid, signal.SIGCONT)
    server.kill()


def test_every_command_says_nats_is_gone_within_10_s(
    gone_nats: str, database_url: str, env: dict[str, str], transcripts: Path
) -> None:
    env |= {"COS_NATS_URL": gone_nats, "COS_DATABASE_URL": database_url}
    check(run_all(NATS_COMMANDS, env, transcripts), "NATS")


def test_commands_say_a_frozen_nats_does_not_answer_within_10_s(
    frozen_nats: str, database_url: str, env: dict[str, str], transcripts: Path
) -> None:
    env |= {"COS_NATS_URL": frozen_nats, "COS_DATABASE_URL": database_url}
    chosen = {name: NATS_COMMANDS[name] for name in ("status", "chat")}
    check(run_all(chosen, env, transcripts), "NATS")


def test_every_command_says_postgres_is_gone_within_10_s(
    nats_url: str, pg_server: PgServer, env: dict[str, str], transcripts: Path
) -> None:
    # Nothing listens on this port: PostgreSQL gone.
    dead = f"{pg_server.admin_url.rsplit('@', 1)[0]}@127.0.0.1:{free_port()}/commonos"
    env |= {"COS_NATS_URL": nats_url, "COS_DATABASE_URL": dead}
    check(run_all(POSTGRES_COMMANDS, env, transcripts), "PostgreSQL")
