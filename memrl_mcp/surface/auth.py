"""Bearer tokens for the HTTP transports: each token is a tenant, the set of namespaces it may use.

Tokens come from the settings (``tokens``) and from a separate file (``tokens_file``), so that secrets can
live apart from the rest of the configuration. Only their SHA-256 digests are kept in memory.
"""

from __future__ import annotations

import hashlib
import ipaddress

from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from starlette.requests import Request
from starlette.responses import JSONResponse

from memrl_mcp.memory.access import EVERYTHING, Access
from memrl_mcp.settings import ALL_NAMESPACES, TokenGrant, grant_digest

NAMESPACES_CLAIM = "memrl_namespaces"
REALM = "memrl-mcp"
HOW = "send 'Authorization: Bearer <token>' with a token from this server's operator (static tokens; no OAuth)"


class TokenTable:
    """The SDK's ``TokenVerifier``: a known token becomes an access token carrying its namespaces."""

    def __init__(self, grants: list[TokenGrant]) -> None:
        self._by_digest = {grant_digest(grant): grant for grant in grants}

    def __len__(self) -> int:
        """How many tokens (tenants) there are."""
        return len(self._by_digest)

    async def verify_token(self, token: str) -> AccessToken | None:
        grant = self._by_digest.get(hashlib.sha256(token.encode()).hexdigest())
        if grant is None:
            return None
        return AccessToken(
            token=token, client_id=grant.name, scopes=[], claims={NAMESPACES_CLAIM: list(grant.namespaces)}
        )

    async def problem(self, authorization: str | None) -> str | None:
        """What is wrong with a request's ``Authorization`` header, in words a client can show its user (None: it
        carries one of the tokens). Read as the SDK's ``BearerAuthBackend`` reads it, so the verdicts agree."""
        if not authorization:
            return f"a bearer token is required, and the request has none: {HOW}"
        if not authorization.lower().startswith("bearer "):
            return f"a bearer token is required, and the Authorization header holds another scheme: {HOW}"
        if await self.verify_token(authorization[len("bearer ") :]) is None:
            return f"a bearer token is required, and this one is not one of this server's tokens: {HOW}"
        return None


def refusal(problem: str) -> JSONResponse:
    """The answer to a request without a valid token, as RFC 6750 (section 3) and the MCP authorization spec that
    builds on it let a client tell a token problem: 401 with a ``Bearer`` challenge of ``error="invalid_token"`` and
    the problem as its description, and the same in the JSON body, which is what clients show their user. (The
    description holds no double quote or backslash, as the header's quoted string requires.)"""
    challenge = f'Bearer realm="{REALM}", error="invalid_token", error_description="{problem}"'
    body = {"error": "invalid_token", "error_description": problem}
    return JSONResponse(body, status_code=401, headers={"WWW-Authenticate": challenge})


def caller(request: Request | None, tokens: TokenTable | None) -> Access | None:
    """What the sender of ``request`` may use, read from that request alone: the token the SDK's
    ``AuthenticationMiddleware`` verified for it (its scope's ``user``). None when the server requires a token
    and this request carries no valid one (no ``Authorization``, another scheme, an unknown token). Without
    HTTP (stdio, an in-process client) there is no request: a local caller, who may use everything when the
    server has no tokens.

    Never from the SDK's ``get_access_token()``: that context variable is set only while an authenticated
    request runs, and uvicorn started a request's task from a copy of an earlier request's context on the same
    kept-alive connection, so a request without a token was served as the earlier tenant (docs/security.md,
    "Identity per request")."""
    user = None if request is None else request.scope.get("user")
    if isinstance(user, AuthenticatedUser):
        return access_of(user.access_token)
    return EVERYTHING if tokens is None else None


def access_of(token: AccessToken) -> Access:
    """What the caller behind a token that :class:`TokenTable` verified may use."""
    assert token.claims is not None  # TokenTable's tokens always carry their namespaces
    namespaces: list[str] = token.claims[NAMESPACES_CLAIM]
    default = namespaces[0] if namespaces[0] != ALL_NAMESPACES else None
    if ALL_NAMESPACES in namespaces:
        return Access(namespaces=None, default=default, client=token.client_id)
    return Access(namespaces=frozenset(namespaces), default=default, client=token.client_id)


def is_loopback(host: str) -> bool:
    """True for addresses only this machine can reach (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
