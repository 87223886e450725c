"""The recorded fixtures of the real CLIs (`make clients`): where they are and what each scenario holds."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clients import FIXTURES


@dataclass(frozen=True)
class Recorded:
    """One recorded scenario of one CLI version."""

    cli: str
    version: str
    name: str
    folder: Path
    manifest: dict[str, Any]

    @property
    def id(self) -> str:
        return f"{self.cli}-{self.version}/{self.name}"

    @property
    def tree(self) -> Path:
        """The folder `cos import <cli>` reads: Claude Code's ``~/.claude`` or Codex's ``CODEX_HOME`` stand-in."""
        return self.folder / ("claude" if self.cli == "claude-code" else "codex")

    @property
    def vendor(self) -> str:
        return "claude" if self.cli == "claude-code" else "codex"

    def calls(self) -> list[dict[str, Any]]:
        """The fake model's usage log: one line per model call it answered."""
        path = self.folder / "usage.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def recorded() -> list[Recorded]:
    """Every recorded scenario of every CLI version folder present."""
    found = []
    for manifest_path in sorted(FIXTURES.glob("*/manifest.json")):
        manifest = json.loads(manifest_path.read_text())
        for name, entry in sorted(manifest["scenarios"].items()):
            folder = manifest_path.parent / name
            if (folder / "usage.jsonl").exists():
                found.append(Recorded(manifest["cli"], manifest["version"], name, folder, entry))
    return found


def fixture_files() -> list[Path]:
    """Every file under the recorded fixtures."""
    return sorted(p for p in FIXTURES.rglob("*") if p.is_file())
