"""Record the scenarios against the real CLIs and write the redacted fixtures.

For each CLI: install the pinned version from npm into ``.cos/clients/`` (outside the tree, cached),
start the fake model, run every scenario in a fresh temporary home and working directory, then write
``tests/fixtures/clients/<cli>-<version>/<scenario>/`` with the transcript tree the CLI wrote
(Claude Code: ``claude/projects/``; Codex: ``codex/sessions/``), the server's ``usage.jsonl`` and
the OTLP payloads (``otlp/``), all redacted, and a ``manifest.json`` saying how each scenario went.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clients import CLAUDE_CODE_VERSION, CODEX_VERSION, FIXTURES, INSTALL_DIR
from clients.fakemodel import CLAUDE_MODEL, CODEX_MODEL, FakeModel, Script, Step
from clients.redact import FAKE_CWD, path_rewrites, redact_jsonl, redact_value, rewrite_paths
from clients.scenarios import CLAUDE, CODEX, SCENARIOS, Run, Scenario, fill, our_texts

PACKAGES = {CLAUDE: ("@anthropic-ai/claude-code", "claude"), CODEX: ("@openai/codex", "codex")}
RUN_TIMEOUT_S = 180.0
INTERRUPT_GRACE_S = 15.0


@dataclass(frozen=True)
class Otlp:
    """Where the CLIs send their telemetry instead of the fake model server: an OTLP endpoint, a token, and for
    Claude Code the OTLP protocol (`http/json`, `http/protobuf`, or `grpc` with the gateway's gRPC endpoint)."""

    endpoint: str
    token: str
    protocol: str = "http/json"


@dataclass
class Outcome:
    code: int | None
    interrupted: bool
    session_id: str | None
    seconds: float
    stderr_tail: str


def install(cli: str, version: str, root: Path = INSTALL_DIR) -> Path:
    """The CLI's executable, installed from npm into ``root/<cli>-<version>`` unless already there."""
    package, binary = PACKAGES[cli]
    prefix = root / f"{cli}-{version}"
    exe = prefix / "node_modules" / ".bin" / binary
    if not exe.exists():
        prefix.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "npm_config_cache": str(root / "npm-cache"), "npm_config_update_notifier": "false"}
        subprocess.run(
            ["npm", "install", "--no-audit", "--no-fund", "--prefix", str(prefix), f"{package}@{version}"],
            env=env,
            check=True,
        )
    return exe


def cli_version(exe: Path) -> str:
    out = subprocess.run([str(exe), "--version"], capture_output=True, text=True, check=True, timeout=60).stdout
    found = re.search(r"\d+\.\d+\.\d+\S*", out)
    return found.group(0) if found else out.strip()


# --- one CLI run ----------------------------------------------------------------------------------


def claude_command(exe: Path, run: Run, first_session: str | None) -> list[str]:
    argv = [str(exe), "-p", run.prompt, "--output-format", "json", "--dangerously-skip-permissions"]
    argv += ["--model", CLAUDE_MODEL]
    if run.follow == "continue":
        argv.append("--continue")
    elif run.follow == "resume" and first_session:
        argv += ["--resume", first_session]
    return argv


def claude_env(base_url: str, home: Path, otlp: Otlp | None = None) -> dict[str, str]:
    telemetry = {"OTEL_EXPORTER_OTLP_ENDPOINT": otlp.endpoint if otlp else base_url}
    if otlp is not None:
        telemetry["OTEL_EXPORTER_OTLP_HEADERS"] = f"Authorization=Bearer {otlp.token}"
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "ANTHROPIC_BASE_URL": base_url,
        "ANTHROPIC_API_KEY": "sk-fake",
        "DISABLE_AUTOUPDATER": "1",
        # The skip-permissions flag is refused as root unless the CLI is told it runs in a sandbox.
        "IS_SANDBOX": "1",
        "CLAUDE_CODE_ENABLE_TELEMETRY": "1",
        "OTEL_METRICS_EXPORTER": "otlp",
        "OTEL_LOGS_EXPORTER": "otlp",
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_PROTOCOL": otlp.protocol if otlp is not None else "http/json",
        **telemetry,
        "OTEL_METRIC_EXPORT_INTERVAL": "1000",
        "OTEL_LOGS_EXPORT_INTERVAL": "500",
        "OTEL_TRACES_EXPORT_INTERVAL": "500",
    }


def codex_config(base_url: str, scenario: Scenario, otlp: Otlp | None = None) -> str:
    lines = [
        f'model = "{CODEX_MODEL}"',
        'model_provider = "fake"',
        'approval_policy = "never"',
        'sandbox_mode = "danger-full-access"',
    ]
    if scenario.name == "compaction":
        lines.append("model_auto_compact_token_limit = 100000")
    lines += [
        "",
        "[model_providers.fake]",
        'name = "fake"',
        f'base_url = "{base_url}/v1"',
        'wire_api = "responses"',
        'env_key = "FAKE_MODEL_API_KEY"',
        "request_max_retries = 0",
        "stream_max_retries = 0",
        "",
        "[otel]",
        "log_user_prompt = false",
        (
            f'exporter = {{ otlp-http = {{ endpoint = "{otlp.endpoint}/v1/logs", protocol = "json", '
            f'headers = {{ "Authorization" = "Bearer {otlp.token}" }} }} }}'
            if otlp is not None
            else f'exporter = {{ otlp-http = {{ endpoint = "{base_url}/v1/logs", protocol = "json" }} }}'
        ),
    ]
    return "\n".join(lines) + "\n"


def codex_command(exe: Path, run: Run, first_session: str | None, cwd: Path) -> list[str]:
    argv = [str(exe), "exec", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox", "-C", str(cwd)]
    if run.follow == "continue":
        argv += ["resume", "--last"]
    elif run.follow == "resume" and first_session:
        argv += ["resume", first_session]
    return [*argv, run.prompt]


def codex_env(home: Path, codex_home: Path) -> dict[str, str]:
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "CODEX_HOME": str(codex_home),
        "FAKE_MODEL_API_KEY": "sk-fake",
    }


async def run_cli(argv: list[str], env: dict[str, str], cwd: Path, server: FakeModel, interrupt: bool) -> Outcome:
    started = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        *argv,
        cwd=cwd,
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
    )
    communicate = asyncio.ensure_future(proc.communicate())
    interrupted = False
    if interrupt:
        stalled = asyncio.ensure_future(server.stalled.wait())
        await asyncio.wait({communicate, stalled}, timeout=RUN_TIMEOUT_S, return_when=asyncio.FIRST_COMPLETED)
        stalled.cancel()
        if server.stalled.is_set() and proc.returncode is None:
            await asyncio.sleep(1.0)  # let the CLI write what it has of the turn
            proc.send_signal(signal.SIGINT)
            interrupted = True
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(communicate), INTERRUPT_GRACE_S)
            if proc.returncode is None:
                proc.terminate()
    try:
        out, err = await asyncio.wait_for(asyncio.shield(communicate), RUN_TIMEOUT_S)
    except TimeoutError:
        proc.kill()
        out, err = await communicate
    text = out.decode(errors="replace") + "\n" + err.decode(errors="replace")
    session = None
    with contextlib.suppress(ValueError, AttributeError, IndexError):
        session = json.loads(out.decode().strip().splitlines()[-1]).get("session_id")
    if session is None:
        found = re.search(r"session id: ([0-9a-f-]{36})", text)
        session = found.group(1) if found else None
    return Outcome(proc.returncode, interrupted, session, round(time.monotonic() - started, 1), err.decode()[-400:])


# --- one scenario ---------------------------------------------------------------------------------


async def run_scenario(
    cli: str, exe: Path, scenario: Scenario, server: FakeModel, root: Path, otlp: Otlp | None = None
) -> tuple[list[Outcome], Path, Path, Path]:
    """Run one scenario's CLI runs in a fresh home under `root`: (outcomes, home, working directory, the
    folder of the transcripts the CLI wrote). Telemetry goes to the fake server, or to `otlp`."""
    home, cwd = root / "home", root / "home" / "project"
    cwd.mkdir(parents=True)
    codex_home = home / ".codex"
    steps = [Step(fill(s.blocks, str(cwd)), s.stall, s.usage) for s in scenario.steps]
    server.use(Script(cli, scenario.name, scenario.number, steps))
    if cli == CODEX:
        codex_home.mkdir()
        (codex_home / "config.toml").write_text(codex_config(server_url(server), scenario, otlp))
    outcomes: list[Outcome] = []
    first_session: str | None = None
    for scripted in scenario.runs:
        run = Run(fill(scripted.prompt, str(cwd)), scripted.follow, scripted.interrupt)
        if cli == CLAUDE:
            argv, env = claude_command(exe, run, first_session), claude_env(server_url(server), home, otlp)
        else:
            argv, env = codex_command(exe, run, first_session, cwd), codex_env(home, codex_home)
        outcome = await run_cli(argv, env, cwd, server, run.interrupt)
        first_session = first_session or outcome.session_id
        outcomes.append(outcome)
    await asyncio.sleep(2.5)  # the last telemetry exports
    tree = (home / ".claude" / "projects") if cli == CLAUDE else (codex_home / "sessions")
    return outcomes, home, cwd, tree


async def record_scenario(cli: str, exe: Path, scenario: Scenario, server: FakeModel, out: Path) -> dict[str, Any]:
    """Run one scenario and write its redacted fixture folder; returns its manifest entry."""
    with tempfile.TemporaryDirectory(prefix="cos-clients-") as tmp:
        outcomes, home, cwd, tree = await run_scenario(cli, exe, scenario, server, real(tmp))
        target = out / scenario.name
        shutil.rmtree(target, ignore_errors=True)
        rewrites = path_rewrites(str(home), str(cwd))
        ours = our_texts(FAKE_CWD)
        folder = "claude/projects" if cli == CLAUDE else "codex/sessions"
        files = write_tree(tree, target / folder, ours, rewrites)
        usage_lines = [json.dumps(rewrite_obj(line, rewrites), sort_keys=True) for line in server.log]
        target.mkdir(parents=True, exist_ok=True)
        (target / "usage.jsonl").write_text("".join(f"{line}\n" for line in usage_lines))
        for index, (kind, payload) in enumerate(server.otlp):
            path = target / "otlp" / f"{index:03d}-{kind}.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            redacted = redact_value(json.loads(rewrite_paths(json.dumps(payload), rewrites)), ours)
            path.write_text(json.dumps(redacted, indent=1, ensure_ascii=False) + "\n")
    calls = len(server.log)
    failed = [o for o in outcomes if o.code != 0 and not o.interrupted]
    status = "ok"
    if failed:
        status = f"a run exited {failed[0].code}"
    elif calls < len(scenario.steps):
        status = f"only {calls} of {len(scenario.steps)} scripted calls were made"
    elif not files:
        status = "no transcript written"
    return {
        "about": scenario.about,
        "status": status,
        "calls": calls,
        "scripted_calls": len(scenario.steps),
        "runs": [{"exit_code": o.code, "interrupted": o.interrupted, "seconds": o.seconds} for o in outcomes],
        "transcript_files": len(files),
        "otlp_payloads": len(server.otlp),
        "totals": totals(server.log),
        **({"stderr_tail": redact_value(outcomes[-1].stderr_tail, set())} if status != "ok" else {}),
    }


def real(path: str) -> Path:
    """The folder without symlinks (the CLIs write resolved paths; the rewrite must see the same)."""
    return Path(path).resolve()


def server_url(server: FakeModel) -> str:
    return f"http://127.0.0.1:{server.port}"


def rewrite_obj(value: Any, rewrites: list[tuple[str, str]]) -> Any:
    return json.loads(rewrite_paths(json.dumps(value), rewrites))


def write_tree(src: Path, dst: Path, ours: set[str], rewrites: list[tuple[str, str]]) -> list[str]:
    """Copy every ``.jsonl`` under src to dst, paths rewritten (names too) and redacted."""
    written: list[str] = []
    if not src.is_dir():
        return written
    for path in sorted(src.rglob("*.jsonl")):
        rel = rewrite_paths(str(path.relative_to(src)), rewrites)
        target = dst / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(redact_jsonl(path.read_text(errors="replace"), ours, rewrites))
        written.append(str(Path(dst.name) / rel))
    return written


def totals(log: list[dict[str, Any]]) -> dict[str, int]:
    keys = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens", "cache_write_1h_tokens")
    sums = {k: sum(int(line["expected"].get(k) or 0) for line in log) for k in keys}
    sums["reasoning_tokens"] = sum(int(line["expected"].get("reasoning_tokens") or 0) for line in log)
    return {"calls": len(log), **sums}


# --- a whole CLI ----------------------------------------------------------------------------------


async def record_cli(cli: str, version: str, fixtures: Path = FIXTURES, only: list[str] | None = None) -> Path:
    exe = install(cli, version)
    actual = cli_version(exe)
    out = fixtures / f"{cli}-{actual}"
    out.mkdir(parents=True, exist_ok=True)
    manifest_path = out / "manifest.json"
    manifest: dict[str, Any] = {"cli": cli, "version": actual, "scenarios": {}}
    if only and manifest_path.exists():
        manifest = json.loads(manifest_path.read_text())
    server = FakeModel()
    await server.start()
    try:
        for scenario in SCENARIOS[cli]():
            if only and scenario.name not in only:
                continue
            started = time.monotonic()
            entry = await record_scenario(cli, exe, scenario, server, out)
            manifest["scenarios"][scenario.name] = entry
            print(
                f"{cli} {actual} {scenario.name}: {entry['status']} ({entry['calls']} calls, "
                f"{time.monotonic() - started:.0f} s)",
                flush=True,
            )
    finally:
        await server.stop()
    manifest["unknown_paths"] = sorted(set(server.unknown))
    manifest_path.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return out


def previous_version(cli: str, current: Path, fixtures: Path = FIXTURES) -> Path | None:
    """The newest other fixture folder of the same CLI, by version number."""

    def key(path: Path) -> tuple[int, ...]:
        return tuple(int(x) for x in re.findall(r"\d+", path.name.removeprefix(cli)))

    others = [
        p for p in fixtures.glob(f"{cli}-*") if p.is_dir() and p != current and p.name[len(cli) + 1 :][:1].isdigit()
    ]
    return max(others, key=key) if others else None


async def record(versions: dict[str, str], only_cli: list[str] | None, only: list[str] | None) -> list[Path]:
    written = []
    for cli, version in versions.items():
        if only_cli and cli not in only_cli:
            continue
        written.append(await record_cli(cli, version, only=only))
    return written


DEFAULT_VERSIONS = {CLAUDE: CLAUDE_CODE_VERSION, CODEX: CODEX_VERSION}
