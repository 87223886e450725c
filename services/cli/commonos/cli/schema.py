"""`cos schema export`: write the JSON Schema of every event into proto/schema/."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from commonos.proto.events import event_json_schema


def export(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "events.schema.json"
    path.write_text(json.dumps(event_json_schema(), indent=2, sort_keys=True) + "\n")
    return path


def _export(args: argparse.Namespace) -> int:
    path = export(args.dir)
    print(f"wrote {path}")
    return 0


def register(sub: Any) -> None:
    schema = sub.add_parser("schema", help="event contracts")
    schema_sub = schema.add_subparsers(dest="schema_command", metavar="SUBCOMMAND", required=True)
    ex = schema_sub.add_parser("export", help="write the JSON Schema of every event (default: proto/schema)")
    ex.add_argument("dir", nargs="?", type=Path, default=Path("proto/schema"))
    ex.set_defaults(handler=_export)
