"""deploy/SUBSCRIBERS.md works as written: every ```sh block of it runs, in order, in one bash session (as a
reader pasting them into one terminal), against a real `cos up`, from the repository root with the project's
virtual environment first on PATH. A ```text block right after a ```sh block is what that block prints: each
of its lines must appear, in order, in the block's output, `…` standing for any text.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.cli.test_up_security import RunningUp, clean_env, up_running
from tests.deploy.conftest import DEPLOY, REPO
from tests.deploy.node_examples import NPM_CACHE, install_node_examples

pytestmark = pytest.mark.slow

DOC = DEPLOY / "SUBSCRIBERS.md"
_FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```\s*$", re.M | re.S)


@dataclass
class Block:
    number: int
    line: int
    script: str
    expected: list[str]


def blocks(text: str) -> list[Block]:
    """The ```sh blocks of `text`, each with the ```text block that follows it (nothing but blank lines between)."""
    fences = list(_FENCE.finditer(text))
    out: list[Block] = []
    for i, fence in enumerate(fences):
        if fence.group(1) != "sh":
            continue
        expected: list[str] = []
        after = fences[i + 1] if i + 1 < len(fences) else None
        if after is not None and after.group(1) == "text" and not text[fence.end() : after.start()].strip():
            expected = [line for line in after.group(2).splitlines() if line.strip()]
        out.append(Block(len(out) + 1, text.count("\n", 0, fence.start()) + 1, fence.group(2), expected))
    return out


def matches(pattern: str, line: str) -> bool:
    return re.fullmatch(".*?".join(re.escape(part) for part in pattern.split("…")), line.rstrip()) is not None


def missing(expected: list[str], output: list[str]) -> str | None:
    """The first expected line not found (in order) in `output`, or None."""
    at = 0
    for pattern in expected:
        while at < len(output) and not matches(pattern, output[at]):
            at += 1
        if at == len(output):
            return pattern
        at += 1
    return None


@pytest.fixture(scope="module")
def cos_up() -> Iterator[RunningUp]:
    with up_running("cos-subscribers-doc-") as running:
        yield running


def test_the_page_has_command_blocks_and_their_outputs() -> None:
    found = blocks(DOC.read_text())
    assert len(found) >= 10
    assert sum(1 for b in found if b.expected) >= 6
    assert not re.search(r"^```(bash|shell|console)\b", DOC.read_text(), re.M), "command blocks are ```sh"


def test_the_page_covers_what_a_subscriber_needs() -> None:
    text = DOC.read_text()
    for needed in (
        "cos env",
        "ce-datacontenttype",
        "ce-dataschema",
        "Nats-Expected-Stream",
        "Cos-Replay-For",
        "--from-seq",
        "--from-time",
        "occurred_at",
        "COS_EVENTS_MAX_AGE",
        "max_payload",
        "compose",
        "Kubernetes",
        "## Versioning",
        "## Retention",
    ):
        assert needed in text, needed


def test_every_command_block_works_as_written(cos_up: RunningUp, tmp_path: Path) -> None:
    install_node_examples()  # npm's cache warm, so the page's `npm ci` needs no network twice
    found = blocks(DOC.read_text())
    script = ["set -euo pipefail"]
    for block in found:
        script += [
            f"printf '\\n@@block {block.number}\\n'",
            block.script.rstrip("\n"),
            f"printf '\\n@@done {block.number}\\n'",
        ]
    env = clean_env(cos_up.data) | {
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "TMPDIR": str(tmp_path),
        "npm_config_cache": str(NPM_CACHE),
        "npm_config_prefer_offline": "true",
        "npm_config_update_notifier": "false",
    }
    done = subprocess.run(
        ["bash", "-c", "\n".join(script)],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=600,
        check=False,
    )
    outputs: dict[int, list[str]] = {}
    current: int | None = None
    finished: set[int] = set()
    for line in done.stdout.splitlines():
        if m := re.fullmatch(r"@@block (\d+)", line):
            current = int(m.group(1))
            outputs[current] = []
        elif m := re.fullmatch(r"@@done (\d+)", line):
            finished.add(int(m.group(1)))
            current = None
        elif current is not None:
            outputs[current].append(line)
    for block in found:
        said = "\n".join(outputs.get(block.number, []))
        assert block.number in finished, (
            f"the block at SUBSCRIBERS.md line {block.line} failed (exit {done.returncode}):\n{block.script}\n"
            f"--- it printed:\n{said}"
        )
        gap = missing(block.expected, outputs[block.number])
        assert gap is None, (
            f"the block at SUBSCRIBERS.md line {block.line} did not print {gap!r}:\n{block.script}\n"
            f"--- it printed:\n{said}"
        )
    assert done.returncode == 0
