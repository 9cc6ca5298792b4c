"""Untrusted text as a model reads it: quoted so that it cannot pass for the server's or a hook's own words, and
bounded so that a recall cannot flood a prompt.

Tasks and experiences are written by agents, and by whatever agents read (web pages, files, tool output, another
project's code): a memory is an instruction channel into every prompt it is recalled for. So each text a model reads
of a memory is shown as one JSON string (:func:`quoted`): a memory cannot start a line, so it cannot write a line
that looks like the server's (``recall_id ...``, an entry ``2. [success, q 0.99, ...]``) or a hook's; what could pass
for markup (``</system-reminder>``, ``<system>``) is defanged; the characters a client might show as a line break
or that reorder or hide text (U+2028, bidi controls, zero-width) are escaped. And one recall shows at most a budget of
characters of experience (:func:`shares`): a long experience is shortened to its head, the rest read at
``memrl://memories/{id}``.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Sequence

TAG = re.compile(r"<(?=[/!?A-Za-z])")
"""The opening of what could pass for markup (a tag, a comment, a declaration): its ``<`` is shown as :data:`ANGLE`."""
ANGLE = "\u2039"  # SINGLE LEFT-POINTING ANGLE QUOTATION MARK: reads as "<" to a person, opens no tag
ELLIPSIS = "…"
HIDDEN = ("Zl", "Zp", "Cf", "Cs", "Cc")
"""Unicode categories shown as escapes: line and paragraph separators, format characters (bidi controls, zero-width
characters), lone surrogates and control characters (NEL among them), but for :data:`KEPT`."""
KEPT = "\n\t"  # control characters of ordinary text: a JSON string escapes them itself


def quoted(text: str) -> str:
    """``text`` as one line of a JSON string that reads as data (:func:`defanged`, then JSON's escapes of quotes,
    backslashes and control characters: no line break survives)."""
    return json.dumps(defanged(text), ensure_ascii=False)


def defanged(text: str) -> str:
    """``text`` with what could pass for markup shown as data (the ``<`` of ``<system>`` as :data:`ANGLE`), and
    every character that a client might show as a line break, or that reorders or hides text, written as its escape
    (``\\u2028``): the form of a memory's text inside the JSON of a tool's structured content, which quotes it
    already."""
    return "".join(map(_shown, TAG.sub(ANGLE, text)))


def _shown(char: str) -> str:
    hidden = unicodedata.category(char) in HIDDEN and char not in KEPT
    return f"\\u{ord(char):04x}" if hidden else char


def shortened(text: str, chars: int) -> str:
    """The head of ``text`` in at most ``chars`` characters, ending with an ellipsis when cut."""
    return text if len(text) <= chars else text[: max(0, chars - 1)] + ELLIPSIS


def shares(lengths: Sequence[int], budget: int) -> list[int]:
    """How many characters of each text to show within ``budget`` in all: each text whole if they all fit, else an
    equal share each, a text shorter than its share leaving the rest to the others."""
    shown = [0] * len(lengths)
    left, open_ = budget, sorted(range(len(lengths)), key=lambda i: lengths[i])
    while open_:
        share = left // len(open_)
        index = open_[0]
        if lengths[index] > share:
            for rest in open_:
                shown[rest] = share
            return shown
        shown[index] = lengths[index]
        left -= lengths[index]
        open_.pop(0)
    return shown
