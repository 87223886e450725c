"""A readable diff of two recorded fixture folders' transcript formats (e.g. two versions of one CLI).

Each transcript line is classified by its record type (Claude Code: ``type``, with ``attachment.type``
or the content block types for attachments and messages; Codex: ``type`` and ``payload.type``), and
each type's keys are collected as dotted paths (list items as ``[]``). The diff lists the types added
and removed, and per type present in both, the keys added and removed.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

#: Below this depth keys are collected; deeper structure (tool schemas, payloads) is not a format change.
MAX_DEPTH = 3


def record_type(record: Any) -> str:
    if not isinstance(record, dict):
        return type(record).__name__
    kind = str(record.get("type", "?"))
    payload = record.get("payload")
    if isinstance(payload, dict) and "type" in payload:
        return f"{kind}/{payload['type']}"
    attachment = record.get("attachment")
    if isinstance(attachment, dict) and "type" in attachment:
        return f"{kind}/{attachment['type']}"
    message = record.get("message")
    if isinstance(message, dict) and isinstance(message.get("content"), list):
        blocks = sorted({str(b.get("type")) for b in message["content"] if isinstance(b, dict)})
        return f"{kind}/{'+'.join(blocks)}" if blocks else kind
    return kind


def key_paths(value: Any, prefix: str = "", depth: int = 0) -> set[str]:
    paths: set[str] = set()
    if depth >= MAX_DEPTH:
        return paths
    if isinstance(value, dict):
        for key, item in value.items():
            path = f"{prefix}.{key}" if prefix else str(key)
            paths.add(path)
            paths |= key_paths(item, path, depth + 1)
    elif isinstance(value, list):
        for item in value:
            paths |= key_paths(item, f"{prefix}[]", depth)
    return paths


def collect(folder: Path) -> dict[str, dict[str, set[str]]]:
    """Per transcript kind (the tree's first folder: claude, codex), per record type, its key paths."""
    found: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    for path in sorted(folder.rglob("*.jsonl")):
        if path.name == "usage.jsonl":
            continue
        kind = path.relative_to(folder).parts[1] if len(path.relative_to(folder).parts) > 2 else "?"
        for line in path.read_text().splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            found[kind][record_type(record)] |= key_paths(record)
    return found


def diff(old: Path, new: Path) -> str:
    """The format changes from fixture folder `old` to `new`, as readable text."""
    a, b = collect(old), collect(new)
    out = [f"format diff {old.name} -> {new.name}"]
    for kind in sorted(set(a) | set(b)):
        types_a, types_b = a.get(kind, {}), b.get(kind, {})
        added = sorted(set(types_b) - set(types_a))
        removed = sorted(set(types_a) - set(types_b))
        out.append(f"[{kind}] {len(types_a)} record types -> {len(types_b)}")
        out += [f"  + type {t}  ({len(types_b[t])} keys)" for t in added]
        out += [f"  - type {t}" for t in removed]
        for t in sorted(set(types_a) & set(types_b)):
            plus, minus = sorted(types_b[t] - types_a[t]), sorted(types_a[t] - types_b[t])
            if plus or minus:
                out.append(f"  ~ type {t}")
                out += [f"      + {k}" for k in plus]
                out += [f"      - {k}" for k in minus]
    if len(out) == 1 + len(set(a) | set(b)):
        out.append("no format changes")
    return "\n".join(out)
