"""Bearer tokens for the HTTP transports: each token is a tenant, the set of namespaces it may use.

Tokens come from the settings (``tokens``) and from a separate file (``tokens_file``), so that secrets can
live apart from the rest of the configuration. Only their SHA-256 digests are kept in memory.
"""

from __future__ import annotations

import hashlib
import ipaddress
from pathlib import Path
from typing import Any

import yaml
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from pydantic import TypeAdapter, ValidationError
from starlette.requests import Request

from memrl_mcp.access import EVERYTHING, Access
from memrl_mcp.settings import ALL_NAMESPACES, Settings, SettingsError, TokenGrant

NAMESPACES_CLAIM = "memrl_namespaces"


def load_grants(settings: Settings) -> list[TokenGrant]:
    """The tokens of the settings and of ``tokens_file``; a bad file or entry is named in the error."""
    grants = list(settings.tokens)
    if settings.tokens_file is not None:
        grants += _grants_from_file(settings.tokens_file)
    names = [grant.name for grant in grants]
    for name in names:
        if names.count(name) > 1:
            raise SettingsError(f"tokens: the name {name!r} is given twice")
    digests = [_digest_of(grant) for grant in grants]
    if len(set(digests)) < len(digests):
        raise SettingsError("tokens: one token is given twice")
    return grants


def _grants_from_file(path: Path) -> list[TokenGrant]:
    try:
        content: Any = yaml.safe_load(path.read_text())
    except OSError as error:
        raise SettingsError(f"tokens_file: cannot read {path}: {error.strerror}") from None
    except yaml.YAMLError as error:
        raise SettingsError(f"tokens_file: {path} is not YAML or JSON: {error}") from None
    if not isinstance(content, dict) or set(content) != {"tokens"}:
        raise SettingsError(f"tokens_file: {path} must hold one key, tokens: a list of tokens")
    try:
        return TypeAdapter(list[TokenGrant]).validate_python(content["tokens"])
    except ValidationError as error:
        problems = "; ".join(f"tokens.{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in error.errors())
        raise SettingsError(f"tokens_file {path}: {problems}") from None


def _digest_of(grant: TokenGrant) -> str:
    if grant.token is not None:
        return hashlib.sha256(grant.token.get_secret_value().encode()).hexdigest()
    assert grant.token_sha256 is not None
    return grant.token_sha256


class TokenTable:
    """The SDK's ``TokenVerifier``: a known token becomes an access token carrying its namespaces."""

    def __init__(self, grants: list[TokenGrant]) -> None:
        self._by_digest = {_digest_of(grant): grant for grant in grants}

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
