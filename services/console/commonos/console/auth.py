"""Who is asking: the signed session cookie or the trusted proxy header; CSRF tokens bound to the sign-in.

* The session cookie (`cos_console`) holds the person's name, a random session id, the time it was issued and
  a fingerprint of their password hash, signed with COS_CONSOLE_SECRET (itsdangerous). It is HttpOnly,
  SameSite=Lax and Secure (unless COS_CONSOLE_INSECURE_COOKIES for http://127.0.0.1). The users file is looked
  up on every request, so a person removed from it, or whose password was changed (`cos console user add`), is
  signed out at once; a sign-out is written down (sign_outs.py), so a copy of the cookie taken before it is
  refused by every console of the database.
* The person is found once per request, before the route runs (`Guard` in guard.py calls `resolve`); when the
  database cannot say whether the sign-in was ended, a page that needs a sign-in answers 503.
* An API key (keys.py), sent as `Authorization: Bearer cosk_…` to the JSON API (`/api/…`), acts as a person of
  its role (`key:<name>`); it is looked up on every request, so a revoked key is refused at once. A request
  with a key is the key's only, whatever cookie it carries; a key that is not one (unknown, revoked) is 401
  with the reason, never "signed in" by the cookie instead.
* The trusted header (COS_CONSOLE_TRUSTED_HEADER) names the person only when the request comes from an address
  in COS_CONSOLE_TRUSTED_PROXIES; from anywhere else it is ignored.
* CSRF: every state-changing request (POST, PUT, PATCH, DELETE) must carry the sign-in's token, as the form
  field `csrf_token` or the header `X-CSRF-Token` (htmx sends it on every request: base.html), and must not come
  from another origin (Origin, when the browser sends one, must be this console's). The token is an HMAC of the
  session id (for a proxy sign-in: of the name), so it needs no storage and dies with the sign-in. A request
  with an API key needs neither: a browser never sends the Authorization header by itself.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import ipaddress
import secrets
import time
from dataclasses import dataclass
from typing import Annotated, Final
from urllib.parse import urlsplit

from fastapi import Depends, HTTPException, Request, Security, WebSocket
from fastapi.security import APIKeyCookie, HTTPAuthorizationCredentials, HTTPBearer
from itsdangerous import BadSignature, URLSafeTimedSerializer
from starlette.requests import HTTPConnection
from starlette.responses import Response

from commonos.console.keys import KEY_PREFIX, ApiKeys, NoApiKeys
from commonos.console.metrics import API_REQUESTS
from commonos.console.settings import ConsoleSettings
from commonos.console.sign_outs import DatabaseUnavailable, MemorySignOuts, SignOuts
from commonos.console.users import User, Users
from commonos.proto.errors import DataError

COOKIE: Final = "cos_console"
CSRF_FIELD: Final = "csrf_token"
CSRF_HEADER: Final = "X-CSRF-Token"
SAFE_METHODS: Final = frozenset({"GET", "HEAD", "OPTIONS"})
#: Where the request's person is kept in its ASGI scope, once resolved; and why it could not be.
_PRINCIPAL: Final = "cos.principal"
_UNAVAILABLE: Final = "cos.principal_unavailable"
#: Why the request's API key was refused (unknown, revoked, malformed).
_KEY_REFUSED: Final = "cos.key_refused"


@dataclass(frozen=True)
class Principal:
    """A signed-in person and the sign-in's CSRF token."""

    user: User
    csrf_token: str
    #: "cookie", "proxy" or "key" (an API key: `Authorization: Bearer`, no CSRF token).
    via: str
    #: The cookie's sign-in id and when the cookie expires (a cookie sign-in only).
    sid: str | None = None
    expires_at: float = 0.0


class NotSignedIn(DataError):
    """No valid sign-in: HTML pages redirect to /login, the API answers 401 (app.py)."""


class Auth:
    def __init__(self, settings: ConsoleSettings, users: Users) -> None:
        self.settings = settings
        self.users = users
        self._serializer = URLSafeTimedSerializer(settings.secret, salt="cos-console-session")
        self._csrf_key = hashlib.sha256(b"cos-console-csrf\0" + settings.secret.encode()).digest()
        self._password_key = hashlib.sha256(b"cos-console-password\0" + settings.secret.encode()).digest()
        #: Replaced by the PostgreSQL store once the console has its database (app.py).
        self.sign_outs: SignOuts = MemorySignOuts()
        #: Replaced by the PostgreSQL store once the console has its database (service.py).
        self.keys: ApiKeys = NoApiKeys()
        #: Password checks (argon2, in threads) at once; more sign-ins wait their turn (pages/signin.py).
        self.password_checks = asyncio.Semaphore(2)

    # The session cookie.

    def password_fingerprint(self, user: User) -> str:
        """What the cookie remembers of the password hash: a new password makes every earlier cookie invalid."""
        digest = hmac.new(self._password_key, (user.password_hash or "").encode(), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest[:12]).decode("ascii")

    def sign_in(self, response: Response, user: User) -> Principal:
        sid = secrets.token_urlsafe(18)
        issued = int(time.time())
        value = self._serializer.dumps({"u": user.name, "s": sid, "t": issued, "h": self.password_fingerprint(user)})
        response.set_cookie(
            COOKIE,
            value,
            max_age=self.settings.session_max_age_s,
            path="/",
            secure=self.settings.secure_cookies,
            httponly=True,
            samesite="lax",
        )
        expires = issued + self.settings.session_max_age_s
        return Principal(user, self.csrf_token("s:" + sid), "cookie", sid, expires)

    async def sign_out(self, response: Response, principal: Principal) -> None:
        """End the sign-in everywhere (DatabaseUnavailable when that cannot be written down), and drop the cookie."""
        if principal.sid is not None:
            await self.sign_outs.add(principal.sid, principal.expires_at)
        response.delete_cookie(COOKIE, path="/", secure=self.settings.secure_cookies, httponly=True, samesite="lax")

    def csrf_token(self, binding: str) -> str:
        return hmac.new(self._csrf_key, binding.encode(), hashlib.sha256).hexdigest()

    async def _from_cookie(self, request: HTTPConnection) -> Principal | None:
        raw = request.cookies.get(COOKIE)
        if not raw:
            return None
        try:
            data = self._serializer.loads(raw, max_age=self.settings.session_max_age_s)
        except BadSignature:
            return None
        if not isinstance(data, dict) or not all(isinstance(data.get(k), str) for k in ("u", "s", "h")):
            return None
        if not isinstance(data.get("t"), int):
            return None
        user = self.users.get(data["u"])
        if user is None or not user.password_hash:
            return None
        if not hmac.compare_digest(data["h"].encode(), self.password_fingerprint(user).encode()):
            return None  # the password was changed since
        if await self.sign_outs.ended(data["s"]):
            return None
        expires = data["t"] + self.settings.session_max_age_s
        return Principal(user, self.csrf_token("s:" + data["s"]), "cookie", data["s"], expires)

    def trusted_peer(self, request: HTTPConnection) -> bool:
        if request.client is None or not self.settings.trusted_proxies:
            return False
        try:
            address = ipaddress.ip_address(request.client.host)
        except ValueError:
            return False
        return any(address in net for net in self.settings.trusted_proxies)

    def _from_proxy(self, request: HTTPConnection) -> Principal | None:
        header = self.settings.trusted_header
        if header is None:
            return None
        name = request.headers.get(header)
        if not name or not self.trusted_peer(request):
            return None
        user = self.users.get(name.strip())
        if user is None:
            return None
        return Principal(user, self.csrf_token("p:" + user.name), "proxy")

    async def _from_key(self, request: HTTPConnection, credentials: str) -> Principal | None:
        key = await self.keys.find(credentials)
        if key is None:
            why = "unknown or revoked" if credentials.startswith(KEY_PREFIX) else f"not a key ({KEY_PREFIX}…)"
            request.scope[_KEY_REFUSED] = f"invalid API key: {why}"
            return None
        # A CSRF token it never needs (bearer requests are not checked), distinct from every sign-in's.
        return Principal(key.user, self.csrf_token("k:" + key.id), "key")

    async def resolve(self, request: HTTPConnection) -> None:
        """Find the person making `request` and keep them in its scope, for `principal`. An API key (JSON API
        only) is the request's only identity; otherwise the proxy header, when believed, wins over a cookie.
        When the database cannot say whether the sign-in was ended or the key revoked, nobody is signed in and
        the reason is kept: pages that need a sign-in answer 503 with it."""
        credentials = bearer_credentials(request)
        # Keys are for the JSON API's requests, not the chat's WebSocket (a browser's, signed in).
        api = is_api_path(request.url.path) and request.scope["type"] == "http"
        try:
            if credentials is not None and api:
                found = await self._from_key(request, credentials)
            else:
                found = self._from_proxy(request) or await self._from_cookie(request)
        except DatabaseUnavailable as exc:
            request.scope[_UNAVAILABLE] = str(exc)
            found = None
        request.scope[_PRINCIPAL] = found
        if api:
            API_REQUESTS.labels(found.via if found is not None else "none").inc()

    def principal(self, request: HTTPConnection) -> Principal | None:
        """The person making `request` (found by `resolve`, before the route ran), or None."""
        if _PRINCIPAL not in request.scope:
            raise RuntimeError("the console's Guard middleware did not resolve the request's person")
        found: Principal | None = request.scope[_PRINCIPAL]
        return found

    def key_refused(self, request: HTTPConnection) -> str | None:
        """Why the request's API key was refused, or None (no key, or a good one)."""
        reason: str | None = request.scope.get(_KEY_REFUSED)
        return reason

    def unavailable(self, request: HTTPConnection) -> str | None:
        """Why nobody could be signed in for `request` (the database is unavailable), or None."""
        reason: str | None = request.scope.get(_UNAVAILABLE)
        return reason

    def same_origin(self, request: HTTPConnection) -> bool:
        """False when the browser says the request comes from a page of another origin."""
        origin = request.headers.get("origin")
        if origin is None or origin == "null":
            # No Origin (an old browser, a script): SameSite=Lax and the token still stand. "null" is refused.
            return origin is None
        if origin.rstrip("/").lower() in self.settings.origins:
            return True
        parts = urlsplit(origin)
        host = request.headers.get("host", "")
        return parts.netloc.lower() == host.lower()

    def check_csrf(self, request: Request, principal: Principal, form_token: str | None = None) -> None:
        """Raise 403 unless the request carries the sign-in's token and comes from this origin (or an API key)."""
        if request.method in SAFE_METHODS or principal.via == "key":
            return
        if not self.same_origin(request):
            raise HTTPException(403, "cross-origin request refused")
        token = request.headers.get(CSRF_HEADER) or form_token or ""
        if not hmac.compare_digest(token.encode(), principal.csrf_token.encode()):
            raise HTTPException(403, "missing or wrong CSRF token")


def is_api_path(path: str) -> bool:
    return path == "/api" or path.startswith("/api/")


def bearer_credentials(request: HTTPConnection) -> str | None:
    """The credentials of an `Authorization: Bearer …` header, or None (no such header, another scheme)."""
    header = request.headers.get("authorization")
    if header is None:
        return None
    scheme, _, credentials = header.strip().partition(" ")
    return credentials.strip() if scheme.lower() == "bearer" else None


#: The two ways into the JSON API, as /api/openapi.json declares them (`securitySchemes`): FastAPI lists them on
#: every operation that needs a sign-in. They only describe: `Auth.resolve` has found the person already.
BEARER_SCHEME: Final = HTTPBearer(
    scheme_name="bearer",
    bearerFormat="cosk_…",
    description="An API key made by `cos console key create` (docs/console.md#api-keys): no CSRF token needed.",
    auto_error=False,
)
COOKIE_SCHEME: Final = APIKeyCookie(
    name=COOKIE,
    scheme_name="cookie",
    description="The sign-in cookie of POST /api/login; state-changing calls also send its csrf_token as X-CSRF-Token.",
    auto_error=False,
)


def get_auth(request: HTTPConnection) -> Auth:
    auth: Auth = request.app.state.auth
    return auth


def optional_principal(request: Request) -> Principal | None:
    """The person, for what a page shows (its header, the sign-in page's redirect); None when nobody is
    signed in, or the request was refused before its person was resolved."""
    found: Principal | None = request.scope.get(_PRINCIPAL)
    return found


def require_principal(
    request: Request,
    _key: Annotated[HTTPAuthorizationCredentials | None, Security(BEARER_SCHEME)] = None,
    _cookie: Annotated[str | None, Security(COOKIE_SCHEME)] = None,
) -> Principal:
    """A page's dependency: the signed-in person or API key (else NotSignedIn: /login for pages, 401 for the
    API; 401 with the reason for a key that is refused)."""
    auth = get_auth(request)
    principal = auth.principal(request)
    if principal is None:
        reason = auth.unavailable(request)
        if reason is not None:
            raise HTTPException(503, reason, headers={"Retry-After": "5"})
        refused = auth.key_refused(request)
        if refused is not None:
            raise HTTPException(401, refused, headers={"WWW-Authenticate": 'Bearer error="invalid_token"'})
        raise NotSignedIn()
    return principal


async def require_csrf(principal: Annotated[Principal, Depends(require_principal)], request: Request) -> Principal:
    """A state-changing route's dependency: signed in, same origin, and the CSRF token (header or form field);
    an API key needs neither."""
    form_token: str | None = None
    if principal.via == "key":
        return principal
    if request.method not in SAFE_METHODS and CSRF_HEADER.lower() not in request.headers:
        content_type = request.headers.get("content-type", "")
        if content_type.startswith(("application/x-www-form-urlencoded", "multipart/form-data")):
            form = await request.form()
            value = form.get(CSRF_FIELD)
            form_token = value if isinstance(value, str) else None
    get_auth(request).check_csrf(request, principal, form_token)
    return principal


def websocket_principal(websocket: WebSocket) -> Principal | None:
    """The person opening a WebSocket, or None: a browser's WebSocket is not bound by the same-origin policy
    and carries the cookie, so a handshake from another origin's page is refused (close it with 1008)."""
    auth = get_auth(websocket)
    if websocket.headers.get("origin") is None or not auth.same_origin(websocket):
        return None
    return auth.principal(websocket)


def require_operator(principal: Annotated[Principal, Depends(require_principal)]) -> Principal:
    if not principal.user.is_operator:
        raise HTTPException(403, "operators only")
    return principal


#: Route parameters: `who: SignedIn`, `who: CsrfChecked` (state-changing routes), `who: Operator`.
SignedIn = Annotated[Principal, Depends(require_principal)]
CsrfChecked = Annotated[Principal, Depends(require_csrf)]
Operator = Annotated[Principal, Depends(require_operator)]
