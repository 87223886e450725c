"""Fixtures of the loop's tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from commonos.loop.profiles import Profile
from tests.loop.helpers import write_profile


@pytest.fixture
def profile(tmp_path: Path) -> Profile:
    return write_profile(tmp_path / "profiles")
