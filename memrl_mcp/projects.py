"""A project's namespace, from the root URI its client sends or from its folder: ``<slug of the folder's name>-<first
8 hex digits of SHA-256(the URI)>`` (``memrl-mcp-3fa9c2d1``), so one server attached to several projects keeps their
memories apart and two folders of the same name do not meet.

The standard library only: the Claude Code plugin's hooks (:mod:`memrl_mcp.clients.core`), fresh processes at each
prompt, build a folder's URI here; the server derives the namespace here from the roots a client sends
(:mod:`memrl_mcp.surface.roots`) or from the ``project_dir`` setting.
"""

from __future__ import annotations

import hashlib
import os
import re
import unicodedata
from urllib.parse import quote, unquote, urlparse

SLUG_CHARS = 40
HASH_CHARS = 8
URI_SAFE = "/!$&'()*+,:;=@"
"""What Node's ``pathToFileURL`` (Claude Code's roots) leaves unescaped besides letters, digits and ``-._``."""


def project_namespace(uri: str) -> str:
    """``<slug of the root's last path component>-<first 8 hex digits of SHA-256(uri)>``: valid for
    :data:`~memrl_mcp.validation.NAMESPACE_PATTERN` (at most 49 characters of ``[A-Za-z0-9_.-]``)."""
    path = unquote(urlparse(uri).path).rstrip("/")
    name = unicodedata.normalize("NFKD", path.rsplit("/", 1)[-1]).encode("ascii", "ignore").decode()
    slug = re.sub(r"[^A-Za-z0-9_.]+", "-", name).strip("-.")[:SLUG_CHARS].strip("-.") or "project"
    return f"{slug}-{hashlib.sha256(uri.encode()).hexdigest()[:HASH_CHARS]}"


def folder_uri(folder: str | os.PathLike[str]) -> str:
    """The ``file://`` URI Claude Code sends as the root of a session opened in ``folder`` (Node's
    ``pathToFileURL(folder).href``, escaping included): the namespace is derived from this exact text."""
    path = "/" + os.path.normpath(os.path.abspath(folder)).lstrip("/")
    return "file://" + quote(os.fsencode(path), safe=URI_SAFE).replace("~", "%7E")
