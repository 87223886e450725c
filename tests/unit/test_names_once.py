"""Vendor names and id namespaces are defined once, in proto (commonos.proto.vendors, commonos.proto.ids).

An id namespace retyped in a service could drift from proto's and mint other ids for the same thing (a call
billed twice); a vendor name retyped could miss a rename. These tests read the code: a namespace literal or a
vendor's name as a string literal anywhere in services/ or libs/ fails them.
"""

from __future__ import annotations

import ast
import uuid
from pathlib import Path

import pytest

from commonos.proto import ids
from commonos.proto.graph.ids import mint_id, model_call_event_id
from commonos.proto.vendors import VENDORS

REPO = Path(__file__).resolve().parents[2]
CODE = sorted(p for d in ("services", "libs") for p in (REPO / d).rglob("*.py"))


def test_the_namespaces_are_the_ids_ever_minted_under_them() -> None:
    # Pinned: a change here changes every stored id (and bills imported calls again).
    assert uuid.UUID("6f1c3b52-2d1e-5a8e-9c57-0c0a7e5e3d10") == ids.GRAPH_NAMESPACE
    assert uuid.UUID("2b7c4e0a-5d3f-5c61-9f2e-8a1d7b6c9e40") == ids.IMPORT_NAMESPACE
    assert uuid.UUID("9d5c0f3e-7b1a-5e24-8c6d-2f4a1b3e5c70") == ids.GATEWAY_NAMESPACE
    assert uuid.UUID("6f1f8f53-54b0-4d3a-9a57-7d0a3f0c2b11") == ids.APPROVAL_NAMESPACE
    assert uuid.UUID("5b0f3c1e-8f0e-4d3a-9b7a-63e0c0b1d9a2") == ids.ALERT_NAMESPACE
    assert uuid.UUID("3b0f6a2e-8f2d-4a8e-9d51-2c4a8d1e7f60") == ids.INTERRUPTED_NAMESPACE
    # And the helpers mint what uuid5 of the JSON array does, as they did before they were shared.
    assert model_call_event_id("inv-1") == uuid.uuid5(ids.IMPORT_NAMESPACE, '["model_call_completed","inv-1"]')
    assert ids.name_id(ids.GATEWAY_NAMESPACE, "a", 'b"') == uuid.uuid5(ids.GATEWAY_NAMESPACE, '["a","b\\""]')
    assert mint_id("session", "codex", "x") == str(uuid.uuid5(ids.GRAPH_NAMESPACE, '["session","codex","x"]'))


def _literals(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), str(path))
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    # A `cos import` subcommand's name (`command="codex"`) is a word of the command line, not the vendor's.
    commands = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.keyword) and node.arg == "command"}
    skip = docstrings | commands
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip
    ]


@pytest.mark.parametrize("what", ["namespace", "vendor"])
def test_services_and_libraries_take_them_from_proto(what: str) -> None:
    namespaces = {str(getattr(ids, n)) for n in dir(ids) if n.endswith("_NAMESPACE")}
    found = []
    for path in CODE:
        for line, text in _literals(path):
            if (what == "namespace" and text in namespaces) or (what == "vendor" and text in VENDORS):
                found.append(f"{path.relative_to(REPO)}:{line}: {text!r}")
    assert not found, f"defined in proto (commonos.proto.{'ids' if what == 'namespace' else 'vendors'}):\n" + "\n".join(
        found
    )
