"""`cos schema export`: write the JSON Schema (2020-12) of every event, alert and core NATS message into proto/schema/.

One file per type and version (`events/<type>/v1.json`, `alerts/<type>/v1.json`, each with its `$id`, which
producers send as `ce-dataschema`; `messages/<name>/v1.json` for the messages never stored: deltas, chat and
approval requests and replies) and the events' union (`events.schema.json`); see `commonos.proto.schemas`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from commonos.proto.schemas import schema_files
from commonos.runtime.args import command_group


def render(document: dict[str, Any]) -> str:
    """A schema file's text, as committed."""
    return json.dumps(document, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def export(directory: Path) -> list[Path]:
    """Write every schema file under `directory`; the paths written, in order."""
    written: list[Path] = []
    for relative, document in schema_files().items():
        path = directory / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(render(document), encoding="utf-8")
        written.append(path)
    return written


def _export(args: argparse.Namespace) -> int:
    paths = export(args.dir)
    print(f"wrote {len(paths)} schema files under {args.dir}")
    return 0


def register(sub: Any) -> None:
    schema_sub = command_group(sub, "schema", "event contracts")
    ex = schema_sub.add_parser(
        "export",
        help="write the JSON Schema of every event, alert and core NATS message type (default: proto/schema)",
    )
    ex.add_argument("dir", nargs="?", type=Path, default=Path("proto/schema"))
    ex.set_defaults(handler=_export)
