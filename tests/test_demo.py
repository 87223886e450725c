"""`cos demo` (what `make demo` runs) on its own embedded servers, end to end."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.harness import cleanup, make_temp_root

pytestmark = pytest.mark.slow


def test_demo_prints_the_three_query_results() -> None:
    root = make_temp_root("cos-demo-")
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith("COS_")}
        env |= {"COS_DATA_DIR": str(root / "data"), "COLUMNS": "200"}
        done = subprocess.run(
            [sys.executable, "-m", "commonos.cli.main", "demo"],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=240,
            check=False,
        )
        out = done.stdout
        assert done.returncode == 0, done.stderr[-3000:] + out[-3000:]
        for title in (
            "The last ten turns, with their status",
            "Tool calls that needed approval, and the answer",
            "Cost per client this month",
        ):
            assert title in out
        # The OTLP gateway runs beside the other services, its endpoint and how to get a token said.
        assert "otlp-gateway" in out and "OpenTelemetry (OTLP/HTTP): http://127.0.0.1:" in out
        assert "cos otlp token create --profile default" in out
        # So does the console, its URL and its first operator said.
        assert "Console: http://127.0.0.1:" in out and "sign in as admin, password in " in out
        turns = out.split("The last ten turns")[1].split("Tool calls that needed approval")[0]
        assert "Summarise this forecast" in turns and "Do I need an umbrella" in turns
        approvals = out.split("Tool calls that needed approval")[1].split("Cost per client")[0]
        assert "shell" in approvals and "approved" in approvals
        assert "write_file" in approvals and "denied" in approvals
        cost = out.split("Cost per client this month")[1]
        # profiles/default/script.toml's 7 calls at config/demo-prices.toml (USD/Mtok: in 3, out 15, cache
        # read 0.30, 5m write 3.75): 4827.9 + 1925.4 + 1937.4 + 1727.4 + 1862.4 + 1607.4 + 327 = 14214.9 µUSD.
        assert "client:acme" in cost and "0.0142149000" in cost
        assert not (Path(root / "data") / "state.json").exists()  # everything stopped

        # What it says to run next explores the demo's data: that command alone (no COS_* of ours), then the
        # cost report the same way, finds the demo's client:acme calls.
        variables, command = command_after(out, "To explore the demo's data")
        assert command == ["cos", "up"] and variables == {"COS_DATA_DIR": str(root / "data")}, (variables, command)
        report = run_while_up(variables, ["report", "cost", "--group-by", "tag:client"])
        assert "client:acme" in report and "0.0142" in report, report
    finally:
        cleanup(root)


def command_after(out: str, heading: str) -> tuple[dict[str, str], list[str]]:
    """The command printed on the line after `heading`: its leading VARIABLE=value words, and the rest."""
    assert heading in out, out[-2000:]
    line = out.split(heading, 1)[1].splitlines()[1]
    words = shlex.split(line)
    variables: dict[str, str] = {}
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
        name, value = words.pop(0).split("=", 1)
        variables[name] = value
    return variables, words


def run_while_up(variables: dict[str, str], argv: list[str]) -> str:
    """`cos up` with `variables` (and no other COS_*), then `cos <argv>` beside it the same way: its output."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("COS_")} | {"COLUMNS": "200"} | variables
    cos = [sys.executable, "-m", "commonos.cli.main"]
    up = subprocess.Popen([*cos, "up"], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    with up:  # closes its pipe; the finally stops it first, whatever happened
        try:
            assert up.stdout is not None
            seen = []
            for line in up.stdout:
                seen.append(line)
                if line.startswith("Running."):
                    break
            else:
                raise AssertionError("cos up did not start:\n" + "".join(seen)[-3000:])
            done = subprocess.run(
                [*cos, *argv], cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False
            )
            assert done.returncode == 0, done.stderr
            return done.stdout
        finally:
            up.terminate()
            up.wait(timeout=60)
