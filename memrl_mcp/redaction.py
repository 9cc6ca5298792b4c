"""What never enters the memory: secrets, and what the user marks ``<private>``.

Prompts, tasks, experiences, observations and commands reach the memory automatically (the Claude Code plugin's
hooks recall for every prompt, and a recall keeps its task), and an agent pastes what it saw: a ``.env`` file, a
``curl -H "Authorization: Bearer ..."``, a database URL with its password. Whatever is stored is recalled into
later prompts, exported in backups and kept on disk; so every text a write path stores passes :func:`redacted`
first (:class:`~memrl_mcp.memory.service.MemoryService`'s writes and recalls, a backup's import), and what a recall
shows passes it again (memories stored before this existed).

1. **``<private>...</private>`` is dropped whole**, tags and all, before anything else reads the text: replaced by
   :data:`WITHHELD`. Tags nest; one left open withholds the rest of the text; the tag's case and spacing do not matter.
2. **Secrets are replaced** by ``[REDACTED:<kind>]``, the kind saying what was there (``github_token``,
   ``connection_string_password``), so a memory still reads "export OPENAI_API_KEY=[REDACTED:openai_api_key]". The
   detector is redact-secret (pinned in pyproject.toml, which says why it and not another): some 120 detectors of
   providers' keys and tokens (checksums and prefixes), private keys, JWTs, bearer and basic credentials, passwords
   in connection strings and keyword assignments; every finding is redacted, whatever action its default policy
   gives it (a "warn" of medium confidence too). :data:`EXTRA` adds what it lets through: short ``.env``-style
   values (``DB_PASSWORD=hunter2``), a password stated in prose, a URL's password in characters a URL should escape,
   Slack webhook URLs, Twilio API keys.

A text the detector cannot read (it raises) is refused rather than stored as it is (:class:`RedactionError`).
docs/security.md says what is and is not caught.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import redact_secret

from memrl_mcp.errors import MemoryRequestError

WITHHELD = "[private]"
ELLIPSIS = "…"
PRIVATE_TAG = re.compile(r"<\s*(/?)\s*private\s*>", re.IGNORECASE)
SECRET_NAME = r"(?:PASSWORD|PASSWD|PASSPHRASE|SECRET|TOKEN|API_?KEY|ACCESS_?KEY|PRIVATE_?KEY|CREDENTIALS?)"
NOT_A_SECRET = re.compile(
    r"\$.*|\*+|x+|<[^>]*>|\.\.\.|null|none|true|false|changeme|your[-_].*|https?://.*", re.IGNORECASE
)
"""A value of a secret's name that is none: a reference to a variable (``${DB_PASSWORD}``), a mask, a placeholder
(``your-api-key-here``), an address (``AUTH_TOKEN_URL=https://...``: a password in it is the URL rule's)."""
WORD = re.compile(r"[a-z]+")
"""A value in prose (``--api-key on the command line``): what an option's secret is not."""
EXTRA: tuple[tuple[str, tuple[str, ...], re.Pattern[str]], ...] = (
    (  # DB_PASSWORD=hunter2, export API_TOKEN='...', docker run -e PGPASSWORD=...: a variable, whatever its length
        "env_secret",
        ("PASSW", "PASSPHRASE", "SECRET", "TOKEN", "KEY", "CREDENTIAL"),
        re.compile(
            rf"(?<![A-Za-z0-9_])[A-Z][A-Z0-9_]*{SECRET_NAME}(?![A-Z0-9_]*_(?:FILE|PATH|LENGTH|LEN|MIN|MAX))"
            rf"[A-Z0-9_]*[ \t]*[=:][ \t]*(?P<value>\"[^\"\n]+\"|'[^'\n]+'|[^\s#'\"]+)"
        ),
    ),
    (  # mysql --password=hunter2, --api-key hunter2: a command's secret-named option
        "option_secret",
        ("passw", "token", "secret", "api-key"),
        re.compile(
            r"(?i)(?<![\w-])--?[a-z-]*(?:password|passwd|token|secret|api-key)[=\s]\s*(?P<value>[^\s\"'-][^\s\"']*)"
        ),
    ),
    (  # "the new password is Kx9#mQ2vL7": a value with a digit or a sign, not a word
        "stated_password",
        ("passw", "passphrase"),
        re.compile(
            r"(?i)\b(?:password|passphrase|passwd)\s+(?:is|was|now is|set to)\s+[\"'`]?"
            r"(?P<value>(?=[^\s\"'`]*[\d\W_])[^\s\"'`]{6,}?)[\"'`]?(?=[\s,;)]|[.!?](?:\s|$)|$)"
        ),
    ),
    (  # amqp://celery:7cRT^O%@rabbit: a URL's password, in whatever characters it was typed
        "url_password",
        ("://",),
        re.compile(r"(?i)\b[a-z][a-z0-9+.-]*://[^/\s:@]*:(?P<value>[^@\s/]+)@"),
    ),
    (
        "slack_webhook",
        ("hooks.slack.com",),
        re.compile(r"https://hooks\.slack\.com/(?:services|workflows|triggers)/[A-Za-z0-9_/-]{16,}"),
    ),
    ("twilio_api_key", ("SK",), re.compile(r"\bSK[0-9a-fA-F]{32}\b")),
)
"""Each: its kind, the words a text must hold for it to be looked for (in lower case for a pattern that ignores case;
a pattern costs more than the detector itself on a long text), and the pattern; a pattern's ``value`` group is the
secret, else all it matches."""


class RedactionError(MemoryRequestError):
    """The secret detector failed on a text: it is refused rather than stored unread."""


def redacted(text: str, limit: int | None = None) -> str:
    """``text`` without its ``<private>`` parts and with its secrets replaced (module docstring); when the
    replacements make it longer than ``limit`` characters, its head within ``limit``."""
    shown = without_private(text)
    spans = secret_spans(shown)
    for start, end, kind in reversed(spans):
        shown = f"{shown[:start]}[REDACTED:{kind}]{shown[end:]}"
    if limit is not None and len(shown) > limit:
        shown = shown[: limit - 1] + ELLIPSIS
    return shown


def redacted_json(value: Any) -> Any:
    """Every string of a JSON value (metadata) :func:`redacted`, keys too."""
    if isinstance(value, str):
        return redacted(value)
    if isinstance(value, Mapping):
        return {redacted(str(key)): redacted_json(item) for key, item in value.items()}
    if isinstance(value, Sequence):
        return [redacted_json(item) for item in value]
    return value


def without_private(text: str) -> str:
    """``text`` with each ``<private>...</private>`` part (nested parts with it, an open one to the end) replaced
    by :data:`WITHHELD`; a stray closing tag is dropped."""
    if "private" not in text.lower():
        return text
    kept, depth, at = [], 0, 0
    for tag in PRIVATE_TAG.finditer(text):
        if depth == 0:
            kept.append(text[at : tag.start()])
        closing = tag.group(1) == "/"
        if not closing:
            if depth == 0:
                kept.append(WITHHELD)
            depth += 1
        elif depth > 0:
            depth -= 1
        at = tag.end()
    if depth == 0:
        kept.append(text[at:])
    return "".join(kept)


def secret_spans(text: str) -> list[tuple[int, int, str]]:
    """Where ``text``'s secrets are, as (start, end, kind) in characters, sorted, overlaps merged (the first kind
    named)."""
    try:
        found = [(f.start, f.end, f.type) for f in redact_secret.scan(text)]
    except redact_secret.SecretScanError as error:
        raise RedactionError(f"a text could not be checked for secrets ({type(error).__name__}): not stored") from None
    lower = text.lower()
    for kind, needles, pattern in EXTRA:
        searched = lower if pattern.flags & re.IGNORECASE else text
        if not any(needle in searched for needle in needles):
            continue
        for match in pattern.finditer(text):
            start, end = match.span("value") if "value" in pattern.groupindex else match.span()
            value = text[start:end].strip("\"'")
            if "value" in pattern.groupindex and (not value or NOT_A_SECRET.fullmatch(value)):
                continue
            if kind == "option_secret" and WORD.fullmatch(value):
                continue
            found.append((start, end, kind))
    merged: list[tuple[int, int, str]] = []
    for start, end, kind in sorted(found):
        if merged and start < merged[-1][1]:
            first = merged[-1]
            merged[-1] = (first[0], max(first[1], end), first[2])
        else:
            merged.append((start, end, kind))
    return merged
