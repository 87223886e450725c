"""The permission matrix of deploy/README.md, asked of a real nats-server running deploy/nats/auth.conf.

Every cell is a probe of `cos security check` (commonos.cli.security): the server's own verdict, not a
reading of the file. The test fails when the configuration and the table in deploy/README.md disagree;
`COS_WRITE_MATRIX=1` writes the table the server gave instead.
"""

from __future__ import annotations

import os
import subprocess
import sys

import nats

from commonos.cli.security import PROBES, STAND_IN, matrix_markdown, probe_identity
from commonos.proto.subjects import EVENTS_STREAM
from commonos.runtime.nats import ensure_streams
from tests.deploy.conftest import DEPLOY, NATS_USERS, SecuredNats, nats_password

START = "<!-- permission matrix: written by tests/deploy/test_permission_matrix.py -->\n"
END = "<!-- end of the permission matrix -->\n"


async def test_the_permission_matrix_in_the_readme_is_what_the_server_enforces(secured_nats: SecuredNats) -> None:
    admin = await nats.connect(secured_nats.url, user="admin", password=nats_password("admin"))
    try:
        js = admin.jetstream()
        await ensure_streams(js)
        results = {user: await probe_identity(secured_nats.url, user, nats_password(user)) for user in NATS_USERS}
        # The probes changed nothing: no event stored, the streams there.
        assert (await js.stream_info(EVENTS_STREAM)).state.messages == 0
        assert STAND_IN not in [c.name for c in await js.consumers_info(EVENTS_STREAM)]
    finally:
        await admin.close()
    # Sanity of the probes themselves: the admin may do everything, the subscriber nothing but read.
    assert all(v.allowed for v in results["admin"].values())
    assert not results["subscriber"]["publish an event"].allowed
    table = matrix_markdown(results)
    readme = DEPLOY / "README.md"
    text = readme.read_text()
    assert START in text and END in text, f"deploy/README.md has no {START.strip()} … {END.strip()} section"
    before, rest = text.split(START, 1)
    current, after = rest.split(END, 1)
    if os.environ.get("COS_WRITE_MATRIX") == "1":
        readme.write_text(before + START + table + END + after)
    assert current == table, f"deploy/README.md's permission matrix is not what the server enforces:\n{table}"
    assert len(table.splitlines()) == len(PROBES) + 2


def test_cos_security_check_prints_the_matrix(secured_nats: SecuredNats) -> None:
    env = {**os.environ, "COS_NATS_URL": secured_nats.url}
    env.update({var: nats_password(user) for user, var in NATS_USERS.items()})
    done = subprocess.run(
        [sys.executable, "-m", "commonos.cli", "security", "check", "--identity", f"loop={nats_password('loop')}"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "| may … | `loop` |"
    assert "| publish an event | yes |" in lines and "| change COS_EVENTS (STREAM.UPDATE) | no |" in lines
    wrong = subprocess.run(
        [sys.executable, "-m", "commonos.cli", "security", "check", "--identity", "loop=wrong"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert wrong.returncode == 2 and wrong.stderr.startswith("cos: error: loop: cannot connect to"), wrong.stderr
