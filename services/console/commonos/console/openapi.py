"""The console's OpenAPI document, as committed in proto/openapi/console.json (`make schema`, `cos console openapi`).

The document a running console serves at /api/openapi.json is the same: made from the routes and their pydantic
models, with the ways in (`securitySchemes`: an API key as a bearer token, the sign-in cookie) on every operation
that needs one. A client generator reads the committed file without starting a console.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Final

#: Where `make schema` writes it, relative to the repository.
EXPORTED: Final = Path("proto/openapi/console.json")


def document() -> dict[str, Any]:
    """The OpenAPI document of the console's JSON API (no settings of this machine enter it)."""
    # Imported here: `cos --help` reads EXPORTED, and need not import every page.
    from commonos.console.app import create_app
    from commonos.console.settings import ConsoleSettings
    from commonos.console.users import Users

    settings = ConsoleSettings(secret="openapi-document-only")
    app = create_app(settings, users=Users(Path("/nonexistent/console-users.toml")))
    return app.openapi()


def render(doc: dict[str, Any]) -> str:
    """The document's text, as committed."""
    return json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def export(path: Path = EXPORTED) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(document()), encoding="utf-8")
    return path
