"""Identifiers: UUIDv7 everywhere, so ids sort by creation time."""

from __future__ import annotations

import uuid

import uuid_utils


def new_id() -> uuid.UUID:
    """A fresh UUIDv7 as a standard-library UUID."""
    return uuid.UUID(bytes=uuid_utils.uuid7().bytes)


def new_id_str() -> str:
    return str(uuid_utils.uuid7())
