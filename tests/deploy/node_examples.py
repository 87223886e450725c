"""deploy/examples' TypeScript subscriber, installed with npm outside the source tree and typed from proto/schema.

The package files (package.json, its lock, tsconfig.json, gen-types.mjs, subscriber.ts) are copied into
`.cos/node-examples/` (npm's cache beside it, `.cos/node-examples-npm/`), `npm ci` installs the pinned
packages there (once: again only when the lock changes), gen-types.mjs writes events.d.ts from what
proto/schema holds now and `tsc --noEmit` type-checks the example against it. npm failing is a test
failure saying so, never a skip.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests.deploy.conftest import DEPLOY, REPO

EXAMPLES = DEPLOY / "examples"
FILES = ("package.json", "package-lock.json", "tsconfig.json", "gen-types.mjs", "subscriber.ts")
FOLDER = REPO / ".cos" / "node-examples"
NPM_CACHE = REPO / ".cos" / "node-examples-npm"
SCHEMA = REPO / "proto" / "schema"


@dataclass(frozen=True)
class NodeExamples:
    folder: Path

    @property
    def tsx(self) -> Path:
        return self.folder / "node_modules" / ".bin" / "tsx"

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "npm_config_cache": str(NPM_CACHE), "npm_config_update_notifier": "false"}


def _run(argv: list[str], cwd: Path, env: dict[str, str], what: str, timeout_s: float = 600) -> str:
    try:
        done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout_s, check=False)
    except FileNotFoundError:
        raise AssertionError(f"{what}: {argv[0]} is not installed (node 20+ and npm are needed)") from None
    except subprocess.TimeoutExpired:
        raise AssertionError(f"{what} took over {timeout_s:.0f}s") from None
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip().splitlines()[-15:]
        raise AssertionError(f"{what} failed (exit {done.returncode}):\n" + "\n".join(said))
    return done.stdout + done.stderr


@functools.cache
def install_node_examples() -> NodeExamples:
    """The examples installed and typed, once per process; test processes running at once (`make test` runs
    two) take turns, holding a lock on a file beside the folder."""
    FOLDER.mkdir(parents=True, exist_ok=True)
    with (FOLDER.parent / "node-examples.lock").open("w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        return _install()


def _install() -> NodeExamples:
    node = NodeExamples(FOLDER)
    lock = (EXAMPLES / "package-lock.json").read_bytes()
    stamp = FOLDER / ".installed-lock"
    for name in FILES:
        shutil.copy2(EXAMPLES / name, FOLDER / name)
    npm = shutil.which("npm") or "npm"
    if not (stamp.exists() and stamp.read_text() == hashlib.sha256(lock).hexdigest() and node.tsx.exists()):
        _run(
            [npm, "ci", "--no-audit", "--no-fund", "--prefer-offline"],
            FOLDER,
            node.env,
            "npm ci of deploy/examples/package.json (network or registry unavailable?)",
        )
        stamp.write_text(hashlib.sha256(lock).hexdigest())
    _run(["node", "gen-types.mjs", str(SCHEMA), "events.d.ts"], FOLDER, node.env, "gen-types.mjs on proto/schema")
    _run([str(FOLDER / "node_modules" / ".bin" / "tsc"), "-p", "."], FOLDER, node.env, "tsc --noEmit of subscriber.ts")
    return node
