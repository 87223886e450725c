"""`cos import claude` on the Claude part of the corpus copied many times, against ccusage on the same files.

The corpus (`../shared/corpus/claude` from the repository root, or `$COS_CORPUS_DIR/claude`) is
copied project by project under `<root>/projects/` until it holds about the requested size. The
copies keep their session ids, so both tools see the same sessions again and again, and dedupe
alike: ccusage by message and request id, the importer by deterministic event ids (JetStream drops
the republished events as duplicates in a full import).

ccusage is installed with npm into `bench/out/ccusage` (npm's cache in `bench/out/.npm`), never
into the repository proper.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Final

CCUSAGE_VERSION: Final = "20.0.24"


class Unavailable(RuntimeError):
    """A figure cannot be measured on this machine; the message says why."""


def corpus_claude_dir(repo_root: Path) -> Path:
    base = (
        Path(os.environ["COS_CORPUS_DIR"]) if os.environ.get("COS_CORPUS_DIR") else repo_root.parent / "shared/corpus"
    )
    claude = base / "claude"
    projects = claude / "projects" if (claude / "projects").is_dir() else claude
    if not projects.is_dir() or not any(projects.rglob("*.jsonl")):
        raise Unavailable(f"no Claude transcripts under {claude} (set COS_CORPUS_DIR to a corpus folder)")
    return projects


def tree_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*.jsonl"))


@dataclass(frozen=True)
class CopiedCorpus:
    root: Path  # holds projects/, as ~/.claude does
    bytes: int
    copies: int


def copy_corpus(projects: Path, dest: Path, target_bytes: int) -> CopiedCorpus:
    """Copy every project folder of `projects` as `<name>-copy<k>` until about `target_bytes` are there."""
    one = tree_bytes(projects)
    copies = max(1, round(target_bytes / one))
    out = dest / "projects"
    out.mkdir(parents=True, exist_ok=True)
    folders = sorted(p for p in projects.iterdir() if p.is_dir())
    for k in range(1, copies + 1):
        for folder in folders:
            shutil.copytree(folder, out / f"{folder.name}-copy{k}")
        for loose in sorted(projects.glob("*.jsonl")):
            shutil.copy2(loose, out / f"{loose.stem}-copy{k}.jsonl")
    return CopiedCorpus(dest, tree_bytes(out), copies)


def ensure_ccusage(prefix: Path, timeout_s: float = 240.0) -> list[str]:
    """The command that runs ccusage (installed with npm into `prefix` when not there yet)."""
    package = prefix / "node_modules" / "ccusage" / "package.json"
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        raise Unavailable("node and npm are not installed, so ccusage cannot run")
    if not package.exists() or json.loads(package.read_text()).get("version") != CCUSAGE_VERSION:
        prefix.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "npm_config_cache": str(prefix.parent / ".npm")}
        try:
            result = subprocess.run(
                [npm, "install", "--prefix", str(prefix), "--no-audit", "--no-fund", f"ccusage@{CCUSAGE_VERSION}"],
                capture_output=True,
                text=True,
                env=env,
                timeout=timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise Unavailable(f"npm install ccusage@{CCUSAGE_VERSION} took over {timeout_s:.0f}s") from None
        if result.returncode != 0 or not package.exists():
            last = (result.stderr or result.stdout).strip().splitlines()[-3:]
            raise Unavailable(f"npm install ccusage@{CCUSAGE_VERSION} failed: {' '.join(last)}")
    bin_entry = json.loads(package.read_text())["bin"]
    script = bin_entry["ccusage"] if isinstance(bin_entry, dict) else bin_entry
    return [node, str(package.parent / script)]
