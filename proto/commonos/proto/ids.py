"""Identifiers: UUIDv7 for what happens (ids sort by creation time), UUIDv5 for what is named.

A name-based id (`name_id`) is the same wherever and whenever it is minted: the importer re-reading a
transcript, the gateway receiving a client's retry, the journal-writer deriving an approval's id from its tool
call. Every namespace is defined here, once; changing one would change every id ever minted under it, and
what was already stored would be stored (or billed) again.
"""

from __future__ import annotations

import uuid
from typing import Final

import msgspec
import uuid_utils

#: The session graph's ids (`commonos.proto.graph.ids.mint_id`).
GRAPH_NAMESPACE: Final = uuid.UUID("6f1c3b52-2d1e-5a8e-9c57-0c0a7e5e3d10")
#: The events the importer publishes, and the `model_call_completed` of a vendor's call whichever way it
#: reaches us (`commonos.proto.graph.ids.model_call_event_id`).
IMPORT_NAMESPACE: Final = uuid.UUID("2b7c4e0a-5d3f-5c61-9f2e-8a1d7b6c9e40")
#: The session, turn and tool-call events the OTLP gateway publishes.
GATEWAY_NAMESPACE: Final = uuid.UUID("9d5c0f3e-7b1a-5e24-8c6d-2f4a1b3e5c70")
#: An approval row of a tool call that never had a request of its own (the journal-writer).
APPROVAL_NAMESPACE: Final = uuid.UUID("6f1f8f53-54b0-4d3a-9a57-7d0a3f0c2b11")
#: A budget's alert of one period (billing).
ALERT_NAMESPACE: Final = uuid.UUID("5b0f3c1e-8f0e-4d3a-9b7a-63e0c0b1d9a2")
#: The `turn_completed` of a turn the loop found interrupted.
INTERRUPTED_NAMESPACE: Final = uuid.UUID("3b0f6a2e-8f2d-4a8e-9d51-2c4a8d1e7f60")


def new_id() -> uuid.UUID:
    """A fresh UUIDv7 as a standard-library UUID."""
    return uuid.UUID(bytes=uuid_utils.uuid7().bytes)


def new_id_str() -> str:
    return str(uuid_utils.uuid7())


def name_id(namespace: uuid.UUID, *parts: str) -> uuid.UUID:
    """The UUIDv5 under `namespace` of the JSON array of `parts` (compact, UTF-8): unambiguous whatever
    characters the parts hold."""
    return uuid.uuid5(namespace, msgspec.json.encode(list(parts)).decode())
