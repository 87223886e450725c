"""Tags: `key:value` labels copied onto every turn (seed: Turns, Sessions and Tags).

Key: lower-case letters, digits, `_` and `-`. Value: letters of either case, digits, `_`, `-`
and `.`. Exactly one `:`. No spaces.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

_KEY = re.compile(r"[a-z0-9_-]+")
_VALUE = re.compile(r"[A-Za-z0-9_.-]+")
# A profile id must also be one NATS subject token, so it follows the tag-key rule with a length cap.
_PROFILE_ID = re.compile(r"[a-z0-9_-]{1,64}")


class InvalidTag(ValueError):
    """A tag that breaks one of the format rules; the message names the rule."""

    def __init__(self, tag: str, rule: str) -> None:
        super().__init__(f"invalid tag {tag!r}: {rule}")
        self.tag = tag
        self.rule = rule


class InvalidProfileId(ValueError):
    def __init__(self, profile_id: str) -> None:
        super().__init__(f"invalid profile id {profile_id!r}: use 1 to 64 lower-case letters, digits, _ or -")
        self.profile_id = profile_id


def parse_tag(tag: str) -> str:
    """Return `tag` unchanged if it is valid, else raise `InvalidTag` naming the broken rule."""
    if any(ch.isspace() for ch in tag):
        raise InvalidTag(tag, "no spaces allowed")
    colons = tag.count(":")
    if colons == 0:
        raise InvalidTag(tag, "no value: a tag is key:value with exactly one ':'")
    if colons > 1:
        raise InvalidTag(tag, f"exactly one ':' allowed, found {colons}")
    key, value = tag.split(":")
    if not key:
        raise InvalidTag(tag, "empty key")
    if not value:
        raise InvalidTag(tag, "no value: a tag is key:value with exactly one ':'")
    if not _KEY.fullmatch(key):
        if _KEY.fullmatch(key.lower()):
            raise InvalidTag(tag, "upper case in the key (key: lower-case letters, digits, _ and -)")
        raise InvalidTag(tag, "bad character in the key (key: lower-case letters, digits, _ and -)")
    if not _VALUE.fullmatch(value):
        raise InvalidTag(tag, "bad character in the value (value: letters, digits, _, - and .)")
    return tag


def is_valid_tag(tag: str) -> bool:
    try:
        parse_tag(tag)
    except InvalidTag:
        return False
    return True


def parse_tags(tags: Iterable[str]) -> list[str]:
    return [parse_tag(t) for t in tags]


def tag_key(tag: str) -> str:
    return tag.split(":", 1)[0]


def resolve_tags(profile_tags: Iterable[str], session_tags: Iterable[str]) -> list[str]:
    """A turn's tags: the profile's plus the session's own, sorted, without duplicates."""
    return sorted(set(parse_tags(profile_tags)) | set(parse_tags(session_tags)))


def check_profile_id(profile_id: str) -> str:
    if not _PROFILE_ID.fullmatch(profile_id):
        raise InvalidProfileId(profile_id)
    return profile_id
