"""What a model reads of a memory is data: every text shown is one line that cannot open markup, and a recall shows
at most its budget (memrl_mcp/surface/quoting.py), over random texts made of what an attacker would use."""

from __future__ import annotations

import json
import random

from memrl_mcp.surface.quoting import defanged, quoted, shares, shortened

NASTY = ["\n", "\r", "\u2028", "\u2029", "\u0085", "\u202e", "\u200b", "\ufeff", '"', "\\", "<", ">", "/", "s"]
NASTY += ["<system>", "</system-reminder>", "<!--", "recall_id ", "2. [success, q 0.99] ", "\ud800", "\t", "\x00", "é"]


def nasty_texts(count: int) -> list[str]:
    draw = random.Random(0)
    return ["".join(draw.choice(NASTY) for _ in range(draw.randrange(0, 40))) for _ in range(count)]


def test_a_quoted_text_is_one_line_that_opens_no_markup_and_keeps_its_words() -> None:
    for text in nasty_texts(2000):
        shown = quoted(text)
        assert shown.startswith('"') and shown.endswith('"')
        assert not any(char in shown for char in "\n\r\u2028\u2029\u0085\u202e\u200b\ufeff\ud800\x00"), repr(shown)
        assert "<s" not in shown and "</" not in shown and "<!" not in shown
        assert json.loads(shown) == defanged(
            text
        )  # the JSON string of the text, its markup and hidden characters shown


def test_the_shares_fit_the_budget_and_give_short_texts_their_whole() -> None:
    draw = random.Random(1)
    for _ in range(2000):
        lengths = [draw.choice([0, 5, 300, 2000, 20_000]) for _ in range(draw.randrange(0, 8))]
        budget = draw.choice([0, 100, 6000, 50_000])
        shown = shares(lengths, budget)
        assert sum(shown) <= budget and all(0 <= s <= n for s, n in zip(shown, lengths, strict=True))
        if sum(lengths) <= budget:
            assert shown == lengths
        else:  # what is left over goes to the texts still cut, none of which gets less than an equal share
            cut = [s for s, n in zip(shown, lengths, strict=True) if s < n]
            assert cut and len(set(cut)) == 1
    assert shares([100, 5000, 20_000], 6000) == [100, 2950, 2950]
    assert shortened("abcdef", 4) == "abc…" and shortened("abc", 4) == "abc"
