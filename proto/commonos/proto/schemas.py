"""The JSON Schema (draft 2020-12) of every event, alert and priced call, derived from their Structs.

`cos schema export` writes :func:`schema_files` under proto/schema/; a test keeps the files equal to it. A file's
path there is its `$id` under :data:`SCHEMA_BASE`:

* `events/<type>/v<version>.json`, `alerts/<type>/v<version>.json`, `costs/<type>/v<version>.json` (billing's
  priced calls, `commonos.proto.costs`): one type and version, self-contained
  (the shapes it uses under `$defs`); its `$id` is what producers send as `ce-dataschema`;
* `events.schema.json`: every event type, a `oneOf` on the constant `type` over the types' definitions, one
  document with plain `#/$defs/...` references (for tools that resolve no embedded `$id`). Alerts have one
  type so far: its file is their schema.
* `messages/<name>/v<version>.json`: the core NATS messages that are not stored (`MESSAGE_TYPES`: a turn's
  deltas, `commonos.proto.deltas`; chat and approval requests and their replies, `commonos.proto.requests`).
  Other services write these too, so a field with a default may be absent, as their decoders accept; they
  carry no `type` (the subject says what a message is).

Every file names the shapes it uses as every other does (`Session`, `GraphAssistantMessage`, `Decimal`, ...).

msgspec writes the first draft (`msgspec.json.schema_components`); this module turns it into what stock
validators accept in strict mode and check fully (ajv with ajv-formats, Python `jsonschema`):

* every field of a Struct is `required`, as msgspec always encodes it, unless the Struct omits defaults
  (`omit_defaults=True`: then a field with a default may be absent) or is a core NATS message (a field with a
  default may be absent); a required field shows no `default`;
* the tag is a `const`; a tagged union is a `oneOf` (no OpenAPI `discriminator`);
* a decimal is a string with a pattern (`#/$defs/Decimal`), not the unknown format `decimal`;
* a `dict[str, Any]` field marked `described_by(SomeStruct)` is described by that Struct's schema;
* a field's own `enum` (`Meta(extra_json_schema=...)`) narrows its enum type (`turn_finished.status`).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable, Iterator
from typing import Any, Final

import msgspec
import msgspec.inspect as mi

from commonos.proto import deltas, requests
from commonos.proto.alerts import ALERT_TYPES
from commonos.proto.costs import COST_TYPES
from commonos.proto.events import DESCRIBED_BY, EVENT_TYPES

JSON_SCHEMA_DIALECT: Final = "https://json-schema.org/draft/2020-12/schema"
SCHEMA_BASE: Final = "https://commonos.dev/schemas"
#: The version of every type's contract (`ce-type` `cos.<type>.v1`); a breaking change is a new type.
CONTRACT_VERSION: Final = 1
EVENTS: Final = "events"
ALERTS: Final = "alerts"
COSTS: Final = "costs"
MESSAGES: Final = "messages"
#: The core NATS messages (never stored), by the name of their schema file, with the subjects they travel on.
MESSAGE_TYPES: Final[dict[str, tuple[type[msgspec.Struct], str]]] = {
    "delta": (deltas.Delta, "cos.deltas.<profile>.<session>: a piece of a turn's reply, live"),
    "chat_request": (requests.ChatRequest, "cos.cmd.<profile>.chat: a turn asked of the profile's loop"),
    "chat_reply": (requests.ChatReply, "the reply to a chat_request (two with `started`)"),
    "approval_request": (requests.ApprovalRequest, "cos.approvals.<profile>.request: a tool call waits"),
    "approval_answer": (
        requests.ApprovalAnswer,
        "cos.approvals.decide.<profile>.<approval_id>.<approver>: a decision",
    ),
    "approval_ack": (requests.ApprovalAck, "the reply to an approval_answer"),
    "pending_query": (requests.PendingQuery, "cos.approvals.pending: which approvals wait now"),
    "pending_approvals": (requests.PendingApprovals, "a loop service's reply to a pending_query"),
}

#: A decimal as `msgspec` writes one (`str(Decimal)`): JSON-number syntax in a string, e.g. `0.0123`, `1E-7`.
DECIMAL_PATTERN: Final = r"^-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?(?!\n)$"
DECIMAL_SCHEMA: Final[dict[str, Any]] = {
    "type": "string",
    "pattern": DECIMAL_PATTERN,
    "description": 'An exact decimal number written as a JSON string (JSON number syntax), e.g. "0.0123" or '
    '"1E-7": parse it with a decimal type, not a binary float.',
}
_DEFS: Final = "#/$defs/"


def schema_path(kind: str, type_name: str, version: int = CONTRACT_VERSION) -> str:
    """Where the schema of one type and version lives under proto/schema/ (and under SCHEMA_BASE)."""
    return f"{kind}/{type_name}/v{version}.json"


def schema_id(kind: str, type_name: str, version: int = CONTRACT_VERSION) -> str:
    """The `$id` of one type and version: what `ce-dataschema` names."""
    return f"{SCHEMA_BASE}/{schema_path(kind, type_name, version)}"


def union_path(kind: str) -> str:
    return f"{kind}.schema.json"


def _tag(struct: type[msgspec.Struct]) -> str:
    return str(struct.__struct_config__.tag)


# --- walking the Structs ---------------------------------------------------------------------------------


def _described_target(t: mi.Type) -> type[msgspec.Struct] | None:
    """The Struct a field's type names with `described_by`, looking through `| None`."""
    if isinstance(t, mi.Metadata):
        target = (t.extra or {}).get(DESCRIBED_BY)
        return target if target is not None else _described_target(t.type)
    if isinstance(t, mi.UnionType):
        for sub in t.types:
            if (target := _described_target(sub)) is not None:
                return target
    return None


def _children(t: mi.Type) -> Iterator[mi.Type]:
    if isinstance(t, mi.Metadata):
        yield t.type
    elif isinstance(t, mi.StructType):
        yield from (f.type for f in t.fields)
    elif isinstance(t, mi.UnionType):
        yield from t.types
    elif isinstance(t, mi.CollectionType):
        yield t.item_type
    elif isinstance(t, mi.TupleType):
        yield from t.item_types
    elif isinstance(t, (mi.DictType, mi.FrozenDictType)):
        yield t.key_type
        yield t.value_type


def _structs(roots: Iterable[type[msgspec.Struct]]) -> dict[type, mi.StructType]:
    """Every Struct reachable from `roots`, the Structs named by `described_by` included."""
    found: dict[type, mi.StructType] = {}
    pending: list[mi.Type] = [mi.type_info(root) for root in roots]
    while pending:
        t = pending.pop()
        if isinstance(t, mi.StructType):
            if t.cls in found:
                continue
            found[t.cls] = t
        if isinstance(t, mi.Metadata) and (target := (t.extra or {}).get(DESCRIBED_BY)) is not None:
            pending.append(mi.type_info(target))
        pending.extend(_children(t))
    return found


def _names(components: dict[str, Any]) -> dict[str, str]:
    """New names for the components msgspec named by their full path because two classes share a name: the
    class of a sub-package (`commonos.proto.graph.model.AssistantMessage`) is prefixed with the package's name
    (`GraphAssistantMessage`), the one of a top-level module keeps its short name."""
    renamed: dict[str, str] = {}
    for name in components:
        if "." not in name:
            continue
        parts = name.split(".")
        in_subpackage = parts[:2] == ["commonos", "proto"] and len(parts) > 4
        renamed[name] = parts[2].capitalize() + parts[-1] if in_subpackage else parts[-1]
    taken = [renamed.get(name, name) for name in components]
    clashes = sorted({name for name in taken if taken.count(name) > 1})
    if clashes:
        raise ValueError(f"two schema components would be named {', '.join(clashes)}: rename a class")
    return renamed


def _component_name(cls: type, components: dict[str, Any]) -> str:
    """The name msgspec gave `cls` among `components`: its class name, or its full path when two clash."""
    full = re.sub(r"[^a-zA-Z0-9.\-_]", "_", f"{cls.__module__}.{cls.__qualname__}")
    if full in components:
        return full
    if cls.__name__ in components:
        return cls.__name__
    raise KeyError(f"msgspec wrote no schema component for {cls!r}")


# --- rewriting msgspec's draft ---------------------------------------------------------------------------


def _as_described(schema: dict[str, Any], ref: str) -> dict[str, Any]:
    """`schema` (a dict field's, perhaps `| None`) with the object replaced by a reference to `ref`."""
    if schema.get("type") == "object":
        out = {k: v for k, v in schema.items() if k in ("description", "title")}
        return {"$ref": ref, **out}
    if "anyOf" in schema:
        return {**schema, "anyOf": [_as_described(option, ref) for option in schema["anyOf"]]}
    if schema.get("type") == "null":
        return schema
    raise ValueError(f"described_by on a field that is no JSON object: {schema}")


def _fix_struct(t: mi.StructType, schema: dict[str, Any], components: dict[str, Any], inbound: bool) -> None:
    properties: dict[str, Any] = schema.setdefault("properties", {})
    if t.tag_field is not None:
        properties[t.tag_field] = {"const": t.tag}
    for field in t.fields:
        target = _described_target(field.type)
        if target is not None:
            properties[field.encode_name] = _as_described(
                properties[field.encode_name], _DEFS + _component_name(target, components)
            )
    if t.cls.__struct_config__.omit_defaults or inbound:
        required = list(schema.get("required", []))
    else:
        required = ([t.tag_field] if t.tag_field is not None else []) + [f.encode_name for f in t.fields]
    for name in required:
        properties[name].pop("default", None)
    if required:
        schema["required"] = required


def _fix_node(node: Any) -> Any:
    """Rewrite msgspec's keywords that strict validators refuse or do not check (see the module docstring)."""
    if isinstance(node, list):
        return [_fix_node(item) for item in node]
    if not isinstance(node, dict):
        return node
    node = {key: _fix_node(value) for key, value in node.items()}
    if node.get("format") == "decimal":
        return {"$ref": _DEFS + "Decimal"}
    if "discriminator" in node:
        del node["discriminator"]
        node["oneOf"] = node.pop("anyOf")
    if "$ref" in node and "enum" in node:  # a field's own enum narrows its enum type
        del node["$ref"]
        node["type"] = "string"
    return node


def _refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith(_DEFS):
            yield ref.removeprefix(_DEFS)
        for value in node.values():
            yield from _refs(value)
    elif isinstance(node, list):
        for item in node:
            yield from _refs(item)


def _reachable(root: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """The definitions `root` uses, directly or through others, sorted by name."""
    seen: set[str] = set()
    pending = list(_refs(root))
    while pending:
        name = pending.pop()
        if name not in seen:
            seen.add(name)
            pending.extend(_refs(defs[name]))
    return {name: defs[name] for name in sorted(seen)}


def _rename_refs(node: Any, renamed: dict[str, str]) -> Any:
    if isinstance(node, list):
        return [_rename_refs(item, renamed) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: _rename_refs(value, renamed) for key, value in node.items()}
    ref = out.get("$ref")
    if isinstance(ref, str) and ref.startswith(_DEFS) and ref.removeprefix(_DEFS) in renamed:
        out["$ref"] = _DEFS + renamed[ref.removeprefix(_DEFS)]
    return out


class _Pool:
    """Every definition the events, alerts and messages use, under one set of names, and the name of each type.

    The Structs reachable from `inbound` (the messages) and from no event or alert are written by other
    services too: their fields with a default may be absent."""

    def __init__(self, roots: Iterable[type[msgspec.Struct]], inbound: Iterable[type[msgspec.Struct]] = ()) -> None:
        stored = _structs(roots)
        structs = {**stored, **_structs(inbound)}
        _, components = msgspec.json.schema_components(list(structs), ref_template=_DEFS + "{name}")
        for cls, info in structs.items():
            _fix_struct(info, components[_component_name(cls, components)], components, cls not in stored)
        renamed = _names(components)
        defs: dict[str, Any] = _rename_refs(_fix_node(components), renamed)
        self.defs = {renamed.get(name, name): schema for name, schema in defs.items()}
        self.defs["Decimal"] = copy.deepcopy(DECIMAL_SCHEMA)
        self.names: dict[type, str] = {}
        for cls in structs:
            name = _component_name(cls, components)
            self.names[cls] = renamed.get(name, name)


def _pool() -> _Pool:
    return _Pool([*EVENT_TYPES, *ALERT_TYPES, *COST_TYPES], [struct for struct, _ in MESSAGE_TYPES.values()])


def type_schema(
    struct: type[msgspec.Struct], kind: str, version: int = CONTRACT_VERSION, pool: _Pool | None = None
) -> dict[str, Any]:
    """The self-contained schema of one event or alert type, with its `$schema` and `$id`."""
    return _document(struct, schema_id(kind, _tag(struct), version), pool or _pool())


def message_schema(name: str, pool: _Pool | None = None) -> dict[str, Any]:
    """The self-contained schema of one core NATS message (`MESSAGE_TYPES`), with its `$schema` and `$id`."""
    struct, travels = MESSAGE_TYPES[name]
    document = _document(struct, schema_id(MESSAGES, name), pool or _pool())
    document["description"] = f"{document.get('description', '').strip()} On {travels}.".strip()
    return document


def _document(struct: type[msgspec.Struct], id_: str, pool: _Pool) -> dict[str, Any]:
    root = copy.deepcopy(pool.defs[pool.names[struct]])
    document: dict[str, Any] = {"$schema": JSON_SCHEMA_DIALECT, "$id": id_, **root}
    used = _reachable(root, pool.defs)
    if used:
        document["$defs"] = {name: copy.deepcopy(schema) for name, schema in used.items()}
    return document


def union_schema(
    kind: str, title: str, description: str, structs: Iterable[type[msgspec.Struct]], pool: _Pool | None = None
) -> dict[str, Any]:
    """One self-contained schema for every type of `kind`: a `oneOf` over the types' definitions (plain
    `#/$defs/...` references, so that tools that do not resolve embedded `$id`s read it too)."""
    pool = pool or _pool()
    names = [pool.names[struct] for struct in structs]
    used: dict[str, Any] = {}
    for name in names:
        used[name] = pool.defs[name]
        used.update(_reachable(pool.defs[name], pool.defs))
    return {
        "$schema": JSON_SCHEMA_DIALECT,
        "$id": f"{SCHEMA_BASE}/{union_path(kind)}",
        "title": title,
        "description": description,
        "oneOf": [{"$ref": _DEFS + name} for name in names],
        "$defs": {name: copy.deepcopy(used[name]) for name in sorted(used)},
    }


def schema_files() -> dict[str, dict[str, Any]]:
    """Every schema file of proto/schema/, by its path there (its `$id` relative to SCHEMA_BASE).

    The events' union is `events.schema.json`; alerts have one type so far, whose file is their schema. The
    core NATS messages have one file each (`messages/<name>/v1.json`), no union: their subjects tell them apart.
    """
    pool = _pool()
    files: dict[str, dict[str, Any]] = {}
    for kind, structs in ((EVENTS, EVENT_TYPES), (ALERTS, ALERT_TYPES), (COSTS, COST_TYPES)):
        for struct in structs:
            files[schema_path(kind, _tag(struct))] = type_schema(struct, kind, pool=pool)
    files[union_path(EVENTS)] = union_schema(
        EVENTS,
        "CommonOS event",
        "The body of any event on cos.events.<profile_id>.<session_id>.<type> (stream COS_EVENTS), tagged by "
        "`type`; `ce-dataschema` names the schema of its type (events/<type>/v1.json beside this file).",
        EVENT_TYPES,
        pool,
    )
    for name in MESSAGE_TYPES:
        files[schema_path(MESSAGES, name)] = message_schema(name, pool)
    return files


def event_schema_id(type_name: str) -> str:
    return schema_id(EVENTS, type_name)


def alert_schema_id(type_name: str) -> str:
    return schema_id(ALERTS, type_name)
