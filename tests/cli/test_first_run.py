"""A newcomer's first run: the five minutes after `cos up`, and every known way `cos up` fails, one line each.

Every command runs as a user runs it: `python -m commonos.cli.main ...` as a subprocess from the source
tree, with nothing configured but COS_DATA_DIR (and HOME where it matters).
"""

from __future__ import annotations

import http.cookiejar
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.cli.test_up_security import RunningUp, clean_env, cos, start_up
from tests.conftest import REPO
from tests.harness import cleanup, make_temp_root
from tests.importer.transcripts import small_claude_home

pytestmark = pytest.mark.slow

GREETING = "Hello! Ask me whether you need an umbrella to see tools, approvals and delegation."


def lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


def no_traceback(done: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in done.stdout + done.stderr, done.stderr[-3000:]


def report(up: RunningUp, *args: str) -> dict[str, Any]:
    done = cos(up.data, "report", "cost", "--format", "json", *args)
    assert done.returncode == 0, done.stderr
    body: dict[str, Any] = json.loads(done.stdout)
    return body


def wait_for_calls(up: RunningUp, calls: int, *args: str, timeout_s: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        body = report(up, *args)
        if body["total"]["calls"] >= calls or time.monotonic() > deadline:
            return body
        time.sleep(0.5)


def console_sessions(url: str, name: str, password: str) -> dict[str, Any]:
    """Sign in to the console through its API (a cookie without Secure: cos up serves http://127.0.0.1) and read
    /api/sessions with that cookie."""
    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    login = urllib.request.Request(
        f"{url}/api/login",
        data=json.dumps({"name": name, "password": password}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with opener.open(login, timeout=30) as answer:
        assert answer.status == 200 and json.loads(answer.read())["role"] == "operator"
        cookie = answer.headers["Set-Cookie"]
        assert "httponly" in cookie.lower() and "secure" not in cookie.lower(), cookie
    with opener.open(f"{url}/api/sessions", timeout=30) as answer:
        assert answer.status == 200
        body: dict[str, Any] = json.loads(answer.read())
    return body


def test_the_first_five_minutes(tmp_path: Path) -> None:
    root = make_temp_root("cos-first-run-")
    up = start_up(root)
    try:
        # state.json is written just before cos up prints what it started: wait for the whole of it.
        deadline = time.monotonic() + 60
        while "Running. Ctrl-C" not in (root / "cos-up.out").read_text() and time.monotonic() < deadline:
            time.sleep(0.2)
        said = lines((root / "cos-up.out").read_text())
        # What a person needs to connect, whole, and what to try next.
        psql = next(line for line in said if line.startswith("PostgreSQL: ")).removeprefix("PostgreSQL: ")
        done = subprocess.run(
            ["bash", "-c", f"{psql} -tAc 'SELECT count(*) FROM sessions'"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert done.returncode == 0 and done.stdout.strip().isdigit(), done.stderr
        assert any(line.startswith("NATS: nats://127.0.0.1:") for line in said)
        assert 'Next, in another shell: cos chat "hello" · cos import claude · cos report cost · cos status' in said
        otlp = next(line for line in said if line.startswith("OpenTelemetry (OTLP/HTTP): "))
        otlp_url = otlp.split()[2]
        made = cos(up.data, "otlp", "token", "create", "--profile", "default", "--name", "first-run")
        assert made.returncode == 0, made.stderr
        otlp_token = made.stdout.strip()
        request = urllib.request.Request(
            f"{otlp_url}/v1/metrics",
            data=b"{}",
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {otlp_token}"},
        )
        with urllib.request.urlopen(request, timeout=30) as answer:
            assert answer.status == 200 and json.loads(answer.read()) == {}
        listed = cos(up.data, "otlp", "token", "list")
        assert listed.returncode == 0 and "first-run" in listed.stdout and otlp_token not in listed.stdout

        # The console: its URL and the first operator's password file said; signing in as admin reads sessions.
        console = next(line for line in said if line.startswith("Console: "))
        console_url = console.split()[1].rstrip("/")
        assert console_url.startswith("http://127.0.0.1:"), console
        password_file = Path(console.split("password in ")[1].split(";")[0])
        assert password_file == up.data.resolve() / "secrets" / "console-admin.password"
        assert f"cos console user add NAME --role operator|analyst|approver --users {up.data.resolve()}" in console
        sessions = console_sessions(console_url, "admin", password_file.read_text().strip())
        assert sessions["sessions"] == [] and sessions["next_cursor"] is None

        status = cos(up.data, "status")
        assert status.returncode == 0, status.stdout + status.stderr
        assert lines(status.stdout)[0] == f"CommonOS: healthy - cos up (pid {up.proc.pid}) in {up.data.resolve()}"

        chat = cos(up.data, "chat", "hello")
        assert chat.returncode == 0, chat.stderr
        assert lines(chat.stdout)[0] == GREETING

        home = small_claude_home(tmp_path)  # two sessions of January 2025, two calls each
        imported = cos(up.data, "import", "claude", str(home), "--no-progress")
        assert imported.returncode == 0, imported.stderr
        assert (
            lines(imported.stdout)[-1]
            == "published 6 events (2 graph parts, 4 model calls): 6 new, 0 already in the stream"
        )

        # Billing prices the chat's call and the imported ones as they arrive: wait for all five first.
        everything = wait_for_calls(up, 5, "--since", "2025-01-01")
        assert everything["total"]["calls"] == 5
        # This month's report: the chat's call, priced as `make demo` prices the scripted model; the imported
        # calls are older, and the report says how many and which --since shows them.
        month = report(up)
        assert month["total"]["calls"] == 1 and month["total"]["unpriced_calls"] == 0 and month["total"]["usd"]
        assert (
            "4 call(s) are before this range (the first on 2025-01-01, by the calls' own times): "
            "`--since 2025-01-01` shows them." in month["notes"]
        )
        table = cos(up.data, "report", "cost")
        assert table.returncode == 0 and lines(table.stdout)[0].startswith("Cost by model, ")
        # The README's cost per client: the default profile bills its turns to client:acme, not to "(none)".
        by_client = report(up, "--group-by", "tag:client")
        assert [(g["group"], g["calls"]) for g in by_client["groups"]] == [("client:acme", 1)]
        assert by_client["untagged"] is None and by_client["total"]["usd"] == month["total"]["usd"]

        state = cos(up.data, "status", "--format", "json")
        assert state.returncode == 0, state.stdout
        body = json.loads(state.stdout)
        assert body["healthy"] is True and body["dead_letters"] == 0 and body["events"] > 0
        assert {s["name"] for s in body["services"] if s["ok"]} == {
            "journal_writer",
            "billing",
            "loop",
            "otlp_gateway",
            "console",
        }
        # The chat's session, now on the console too.
        deadline = time.monotonic() + 30
        while not (sessions := console_sessions(console_url, "admin", password_file.read_text().strip()))["sessions"]:
            assert time.monotonic() < deadline, "the chat's session never reached the console"
            time.sleep(0.5)
        assert [s["source"] for s in sessions["sessions"] if s["kind"] == "loop"] == ["cli"]
        assert "journal-writer" in {c["name"] for c in body["consumers"]}
        for done in (status, chat, imported, table, state):
            no_traceback(done)

        # A service that stops makes the status unhealthy, and says which.
        os.kill(up.state["pids"]["loop"], signal.SIGKILL)
        deadline = time.monotonic() + 30
        while (down := cos(up.data, "status")).returncode == 0 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert down.returncode == 1
        assert lines(down.stdout)[0] == f"CommonOS: UNHEALTHY - cos up (pid {up.proc.pid}) in {up.data.resolve()}"
        assert [line for line in lines(down.stdout) if line.startswith("problem: ")] == [
            "problem: loop: no answer ([Errno 111] Connection refused)"
        ]
    finally:
        up.stop()
        cleanup(root)


def test_status_without_a_system_says_so_and_fails(tmp_path: Path) -> None:
    done = cos(tmp_path / "nothing", "status")
    assert done.returncode == 1
    assert lines(done.stdout) == [
        "CommonOS: not running - no system to talk to: set COS_NATS_URL and COS_DATABASE_URL, or start one with "
        f"`cos up` (looked for {tmp_path / 'nothing' / 'state.json'})"
    ]
    as_json = cos(tmp_path / "nothing", "status", "--format", "json")
    assert as_json.returncode == 1 and json.loads(as_json.stdout)["healthy"] is False


def test_an_import_with_no_transcripts_says_where_it_looked(tmp_path: Path) -> None:
    env = clean_env(tmp_path / "data") | {"HOME": str(tmp_path)}
    for vendor, label, where in (
        ("claude", "Claude Code", "~/.claude/projects/<project>/<session>.jsonl (with their subagents' agent-*.jsonl)"),
        ("codex", "Codex", "~/.codex/sessions/YYYY/MM/DD/rollout-*.jsonl"),
    ):
        done = subprocess.run(
            [sys.executable, "-m", "commonos.cli.main", "import", vendor, "--dry-run"],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 2
        assert lines(done.stderr) == [
            f"cos: error: {tmp_path / ('.' + vendor)} not found: no {label} transcripts to import there ({label} keeps "
            f"them in {where}); give the folder: cos import {vendor} PATH"
        ]


def up_check(data: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "commonos.cli.main", "up", "--check"],
        cwd=REPO,
        env=clean_env(data) | env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def test_cos_up_without_postgresql_binaries_is_one_line() -> None:
    root = make_temp_root("cos-up-no-pg-")
    try:
        done = up_check(root / "data", COS_PG_BINDIR=str(root / "no-bin"))
        assert done.returncode == 1
        assert lines(done.stderr) == [
            f"cos: error: COS_PG_BINDIR={root / 'no-bin'} holds no initdb and postgres: set it to PostgreSQL's "
            "bin folder"
        ]
    finally:
        cleanup(root)


def test_cos_up_with_a_secret_it_cannot_use_is_one_line() -> None:
    root = make_temp_root("cos-up-bad-secret-")
    try:
        secret = root / "data" / "secrets" / "postgres.password"
        secret.parent.mkdir(parents=True, mode=0o700)
        secret.write_text("not a secret!\n")
        secret.chmod(0o600)
        done = up_check(root / "data")
        assert done.returncode == 1
        assert lines(done.stderr) == [
            f"cos: error: {secret} does not hold a secret cos up can use (16 to 256 letters and digits, the first a "
            "letter): delete it and cos up makes a new one"
        ]
    finally:
        cleanup(root)


def test_cos_up_takes_another_port_when_the_remembered_one_is_taken() -> None:
    root = make_temp_root("cos-up-port-")
    try:
        data = root / "data"
        first = up_check(data)
        assert first.returncode == 0, first.stderr
        remembered = json.loads((data / "ports.json").read_text())
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
            taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # the port may still be in TIME_WAIT
            taken.bind(("127.0.0.1", remembered["postgres"]))
            taken.listen()
            again = up_check(data)
        assert again.returncode == 0, again.stderr
        no_traceback(again)
        assert json.loads((data / "ports.json").read_text())["postgres"] != remembered["postgres"]
    finally:
        cleanup(root)
