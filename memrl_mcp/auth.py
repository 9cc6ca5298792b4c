"""Bearer tokens for the HTTP transports: each token is a tenant, the set of namespaces it may use.

Tokens come from the settings (``tokens``) and from a separate file (``tokens_file``), so that secrets can
live apart from the rest of the configuration. Only their SHA-256 digests are kept in memory.
"""

from __future__ import annotations

import hashlib
import ipaddress

from mcp.server.auth.provider import AccessToken

from memrl_mcp.access import EVERYTHING, Access
from memrl_mcp.settings import ALL_NAMESPACES, TokenGrant, grant_digest

NAMESPACES_CLAIM = "memrl_namespaces"


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


def access_of(token: AccessToken | None) -> Access:
    """What the caller behind ``token`` may use; no token (stdio, or a server without tokens) is everything."""
    if token is None or token.claims is None or NAMESPACES_CLAIM not in token.claims:
        return EVERYTHING
    namespaces: list[str] = token.claims[NAMESPACES_CLAIM]
    default = namespaces[0] if namespaces[0] != ALL_NAMESPACES else None
    if ALL_NAMESPACES in namespaces:
        return Access(namespaces=None, default=default)
    return Access(namespaces=frozenset(namespaces), default=default)


def is_loopback(host: str) -> bool:
    """True for addresses only this machine can reach (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
