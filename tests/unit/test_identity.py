import uuid

import msgspec
import pytest

from commonos.proto.identity import NewSession, TurnInfo, title_from_text
from commonos.proto.ids import new_id
from commonos.proto.tags import InvalidProfileId, InvalidTag


def test_ids_are_uuid7_and_sort_by_creation() -> None:
    ids = [new_id() for _ in range(1000)]
    assert all(i.version == 7 for i in ids)
    assert ids == sorted(ids)


def test_child_turn_copies_profile_and_tags_one_level_deeper() -> None:
    parent = TurnInfo(profile_id="default", session_id=new_id(), turn_id=new_id(), tags=("client:acme", "project:site"))
    child = parent.child()
    assert child.profile_id == parent.profile_id
    assert child.tags == parent.tags
    assert child.session_id != parent.session_id
    assert child.turn_id != parent.turn_id
    assert child.parent_turn_id == parent.turn_id
    assert child.depth == parent.depth + 1 == 1
    given = uuid.uuid4()
    assert parent.child(session_id=given).session_id == given


def test_turn_info_rejects_bad_identity() -> None:
    with pytest.raises(InvalidProfileId):
        TurnInfo(profile_id="Bad Profile", session_id=new_id(), turn_id=new_id())
    with pytest.raises(InvalidTag):
        TurnInfo(profile_id="p", session_id=new_id(), turn_id=new_id(), tags=("Area:x",))


def test_turn_info_json_round_trip() -> None:
    t = TurnInfo(profile_id="p", session_id=new_id(), turn_id=new_id(), tags=("a:b",))
    assert msgspec.json.decode(msgspec.json.encode(t), type=TurnInfo) == t


def test_new_session_and_title() -> None:
    s = NewSession(profile_id="p", source="cli", title=title_from_text("x" * 100))
    assert s.title == "x" * 60
    assert title_from_text("short") == "short"
