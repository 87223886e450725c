"""Ground truth for the importer: the real Claude Code and Codex CLIs against a fake model (`make clients`).

The pinned versions live here; `make clients CLAUDE_CODE_VERSION=... CODEX_VERSION=...` (or
``python -m clients record --claude-code-version ...``) records others.
"""

from __future__ import annotations

from pathlib import Path

CLAUDE_CODE_VERSION = "2.1.332"
CODEX_VERSION = "0.171.0"

ROOT = Path(__file__).resolve().parent.parent
#: Where the recorded, redacted fixtures go (one folder per CLI and version).
FIXTURES = ROOT / "tests" / "fixtures" / "clients"
#: Where the CLIs are installed from npm (gitignored, with npm's cache beside them).
INSTALL_DIR = ROOT / ".cos" / "clients"
