"""The user's next prompt read as feedback on the task before it: did it say the task worked, or that it did not, and
does it go on with the same task? Pure and standard-library only (a hook reads it before recalling for the prompt).

A wrong verdict teaches the memory the opposite of what happened, so the reading is conservative: a verdict needs
words about the outcome (``works now``, ``still failing``, ``that broke the build``, ``revert that``, ``lgtm``), not
politeness (``thanks``, ``ok``, ``cool`` say nothing of it), and none is read from

- a question that asks (``does it work now?``; a ``why`` question keeps what it presumes: ``why is it still
  failing?``), a condition or an order (``if it works, commit it``, ``make sure the tests pass``);
- words negated (``not working`` and ``no longer works`` say it failed; ``no longer fails`` and ``no more errors``
  that it works);
- a prompt that says both (``works on linux, fails on mac``); after a ``but``, only a failure still counts
  (``the unit tests pass but the integration test fails``).

``continues``: whether the prompt goes on with the same task (feedback, a correction, a request about the same work:
``rename it``, ``also add a test``, ``same for the delete endpoint``), else it starts a new, unrelated one
(``next task: ...``, or a request that refers to nothing before it). Measured on a labelled set
(tests/data/followups.jsonl, perf/followups.py, docs/performance.md)."""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class FollowUp:
    """What a prompt says of the task before it: ``verdict`` True (it worked), False (it did not), None (neither);
    ``continues``: it goes on with the same task."""

    verdict: bool | None
    continues: bool


TYPOS = {
    "wroks": "works", "wokrs": "works", "workd": "worked", "wokring": "working", "workign": "working",
    "wrok": "work", "faling": "failing", "failling": "failing", "fialing": "failing", "stil": "still",
    "brokn": "broken", "thnaks": "thanks", "thansk": "thanks", "doesnt": "doesn't", "dont": "don't",
    "didnt": "didn't", "isnt": "isn't", "wont": "won't", "cant": "can't", "arent": "aren't", "hasnt": "hasn't",
    "thats": "that's", "its": "it's", "perfecto": "perfect", "pefect": "perfect", "compils": "compiles",
}  # fmt: skip
"""Misspellings seen in quick replies, to the words the patterns know."""

NEGATOR = r"(?:not|never|no longer|n't|stopped|hardly|used to)"
WORKED = re.compile(
    r"(?<!let's )(?<!start )\b(?:works|worked)\b|\b(?:it's|is|are|now|still|finally|everything's|all|seems to be|'s"
    r"|confirmed) working\b|\bworking (?:now|fine|again|perfectly|great)\b"
    r"|\bsorted (?:it|that)\b|\b(?:fixed|solved|resolved|perfect(?:ly)?|lgtm|awesome|excellent|brilliant|great|nice|amazing"
    r"|fantastic|wonderful|correct|exactly|confirmed|nailed it|ship it|well done|did the trick|all good)\b"
    r"|\b(?:tests?|it|they|all|suite|build|ci|checks?|everything)(?: \w+)? (?:pass|passes|passing|passed)\b"
    r"|^(?:pass|passes|passing|passed)\b|\b(?:looks?|all) (?:good|great|fine|correct|right)\b"
    r"|\b(?:good|great|nice) (?:job|work|stuff)\b|\bthat did it\b|\bthat'?s (?:it|right|correct|what i)\b"
    r"|\b(?:is|are|all|now|tests?|ci|build) green\b|\b(?:compiles|builds|runs|starts|loads) (?:now|fine|again)\b"
    r"|\b(?:is|are|'s) gone\b|👍"
)
"""Words that say the task worked (unless negated: :data:`NEGATOR` just before them)."""
STILL_BAD = (
    r"(?:fail\w*|broken|broke|crash\w*|errors?|\w+error|exceptions?|wrong|red|the same|same|not|doesn't|don't"
    r"|isn't|won't|no good|getting|seeing|throws|returns|there|hangs?|issue|problem|bug|\d+ fail\w*)"
)
FAILED = re.compile(
    rf"\bstill\b(?:\s+\w+){{0,3}}?\s+{STILL_BAD}\b"
    r"|\b(?:doesn't|does not|didn't|did not|isn't|is not|won't|can't|cannot|not|never)(?: seem to)?"
    r" (?:work|working|help|compile|build|run|start|load|fix(?:ed)?|change|pass|passing|right|correct|quite|it\b)"
    r"|\bno longer (?:works?|working|compiles|builds|runs|passes|starts)"
    r"|\b(?:is|are|'s|got|now|it|that|this|you|everything|has|have)\s+(?:\w+\s+)?(?:broke|broken|breaks)\b"
    r"|\bbroke (?:the|my|it|everything)|\bbroken again\b|\bbreaks everything\b"
    r"|^(?:please |can you |could you )?(?:revert|undo|roll ?back)\b|\broll (?:it|that|this|them) back\b"
    r"|\bput (?:it|that|them|this) back\b"
    r"|^(?:(?:hmm+|oh|ah|well|um+)\W+)?(?:no|nope|nah)(?:\s*[,.!]|\s*$|\s+(?:i meant|that|this|it|use|keep|no|luck|good)\b)"
    r"|\b(?:wrong|incorrect)\b|\bnot what i (?:asked|wanted|meant)|\bi meant\b"
    r"|\b(?:made it|is|it's) worse\b|\bworse than\b|\bsame (?:error|problem|issue|result|traceback|thing)\b"
    r"|(?<!\bthe )(?<!\ba )\b(?:fails?|failing|failed)\b|(?<!\bthe )\b(?:crash(?:es|ed|ing)?|hangs|hanging)\b"
    r"|\bnow\b.*\b(?:get|getting|got|see|seeing|shows?|throws?|raises?|says?|reports?|gives?)\b.*"
    r"\b(?:\w*error|exception|traceback|\d+ errors?)\b|\b(?:error|traceback|exception) is still\b"
    r"|\bnothing (?:changed|works)\b|\b(?:didn't|did not|doesn't) change anything\b"
    r"|\b(?:are|is) red\b|\bred now\b|\bused to work\b|\bwork(?:ed|ing)? before\b"
    r"|\byou (?:forgot|deleted|removed|broke|missed|delete|remove|break)\b|\bno luck\b|\bno good\b|\bblank now\b"
    r"|\b(?:doesn't|does not|isn't|don't)\s*$"
)
"""Words that say the task did not work."""
NOT_FAILED = re.compile(
    r"(?:\b(?:no longer|not|never|stopped)|n't) (?:\w+ )?(?:fail\w*|crash\w*|broken|errors?|hang\w*)\b(?: anymore)?"
    r"|\bno (?:more )?(?:errors?|failures?|crash(?:es)?|warnings?)\b|\b0 (?:failures|failed|errors)\b"
    r"|\b(?:fail|crash|error)\w* (?:anymore|no more)\b|\b(?:error|problem|bug) is gone\b"
)
"""A failure negated: it says the task works (``no longer fails``, ``no more errors``)."""
WHY = re.compile(r"^(?:why|how come)\b")
ASKING = re.compile(r"^(?:what|what's|how|where|which|who|when|whether)\b")
"""A sentence that asks, even without its question mark."""
HYPOTHETICAL = re.compile(
    r"\b(?:if|once|when|whether|unless|until|make sure|ensure|check (?:that|if|whether)|verify|should|must|needs? to"
    r"|has to|have to|would|could|might|so that|in case|hope|let's see|expect|make it|get it|want it to)\b"
)
"""Words that make what follows them in their clause a condition or an order, not a report."""
CONTRAST = re.compile(r"\b(?:but|though|however|except|although|yet)\b(?!\s+(?:can|could|please|also|just|let's)\b)")
"""A contrast followed by a statement (``..., but the linter complains``), not by a request."""
NEW_TASK = re.compile(
    r"\b(?:new task|next task|next up|moving on|move on|switch(?:ing)? to|different (?:question|thing|topic|task)"
    r"|something (?:else|different)|unrelated|another (?:task|thing|question)|forget (?:about )?(?:it|that)"
    r"|never ?mind|nvm|now let's|let's now|let's do)\b|(?:^|[.!?,:;]\s*)next\b"
)
SAME_WORK = re.compile(
    r"\b(?:again|also|too|as well|same|actually|still|anymore|the fix|your change|the changes? you|you (?:just )?"
    r"(?:added|wrote|changed|made|did|removed|deleted|created)|one more thing|while you're at it|the other \w+"
    r"|the (?:first|second) (?:part|one)|what about|what if|how about|go ahead|go on|continue|keep going|do that"
    r"|almost|closer|squash the|(?:commit|push) (?:it|this|that|them|the changes?)|open a pr|pull request|changelog"
    r"|explain(?:ing)? why|did you|but|(?:re)?run (?:the )?(?:full )?(?:tests?|test suite|suite|linter|build|mypy"
    r"|ruff|ci))\b|\binstead\s*[.!?]*$|^(?:instead|just|and|push|commit)\b"
)
"""Words that go on with the work before (a correction, more of the same, a word on what was done)."""
POINTING = re.compile(r"\b(?:it|this|these|those|them)\b")
THAT = re.compile(r"\b(?:to|for|in|into|on|of|with|from|about|move|rename|split|fix|change|update|test|revert) that\b")
"""``that`` pointing at the work (``tests for that``, ``move that function``), not a relative ``that``."""
ACKNOWLEDGE = re.compile(
    r"^(?:thanks?|thank you|thx|ty|cheers|ok|okay|cool|sure|yes|yep|yeah|alright|great|nice|perfect|awesome"
    r"|excellent|brilliant|lgtm|\W+)(?:\W|$)"
)
CLAUSES = re.compile(r"[.!?;:\n]+|,\s+")
CLAUSE_START = re.compile(r"[,;:]")


def _normal(prompt: str) -> str:
    text = prompt.lower().replace("\u2019", "'").replace("\u2018", "'")
    return " ".join(TYPOS.get(word, word) for word in text.split())


def _sentences(text: str) -> list[tuple[str, bool]]:
    """The sentences of ``text``, each with whether it asks (ends with a question mark)."""
    parts = re.split(r"(?<=[.!?])\s+|\n+", text)
    return [(part.strip(" .!"), part.rstrip().endswith("?")) for part in parts if part.strip(" .!?")]


def _before(sentence: str, found: re.Match[str]) -> str:
    """The words of its clause before a match."""
    clause = sentence[: found.start()]
    starts = [m.end() for m in CLAUSE_START.finditer(clause)]
    return clause[starts[-1] if starts else 0 :]


def _reported(sentence: str, found: re.Match[str], asks: bool) -> bool:
    """Whether a verdict's words are reported: not a condition or an order (``if it works``, ``make sure the tests
    pass``: a word of :data:`HYPOTHETICAL` before them in their clause), not asked (in the last clause of a question,
    but a ``why`` question presumes what it asks of)."""
    if asks and not WHY.match(sentence) and not CLAUSE_START.search(sentence[found.end() :]):
        return False
    return HYPOTHETICAL.search(_before(sentence, found)) is None


def _verdict(sentence: str, asks: bool) -> tuple[bool, bool]:
    """Whether ``sentence`` says the task worked and whether it says it failed (both: it says both). A ``why``
    question (``why is it still failing?``) presumes a failure, never a success."""
    plain = NOT_FAILED.sub(" ", sentence)
    failed = any(_reported(plain, found, asks) for found in FAILED.finditer(plain))
    if asks and WHY.match(sentence):
        return False, failed
    worked = any(_reported(sentence, found, asks) for found in NOT_FAILED.finditer(sentence))
    contrast = CONTRAST.search(sentence)
    for found in WORKED.finditer(sentence):
        if not _reported(sentence, found, asks):
            continue
        if re.search(rf"{NEGATOR}\W*(?:\w+\W+){{0,2}}$", _before(sentence, found)) or re.match(
            r"\s*(?:before|anymore)\b", sentence[found.end() :]
        ):
            failed = True  # not working, used to work, worked before
        elif contrast is None or found.start() > contrast.start():
            worked = True
    return worked, failed


def read_followup(prompt: str) -> FollowUp:
    """What ``prompt`` says of the task before it (module docstring)."""
    text = _normal(prompt)
    new = NEW_TASK.search(text)
    worked = failed = said = False
    for sentence, asks in _sentences(text[: new.start()] if new else text):  # what follows a new task is its own
        good, bad = _verdict(sentence, asks or ASKING.match(sentence) is not None)
        worked, failed = worked or good, failed or bad
        said = said or any(pattern.search(sentence) for pattern in (WORKED, FAILED, NOT_FAILED))
    verdict = None if worked == failed else worked
    if new:
        return FollowUp(verdict, False)
    clauses = [clause.strip() for clause in CLAUSES.split(text) if clause.strip()]
    while clauses and (ACKNOWLEDGE.match(clauses[0]) or (verdict is not None and _says(clauses[0]))):
        clauses.pop(0)  # the feedback, or the thanks, before a request
    rest = " ".join(clauses)
    if verdict is False or not rest or len(text.split()) <= 4:
        return FollowUp(verdict, True)
    words = rest.split()
    pointing = bool(POINTING.search(" ".join(words[:4])) or re.match(r"(?:\w+ )?that\b", rest) or THAT.search(rest))
    pointing = pointing or (len(words) <= 8 and POINTING.search(" ".join(words[-2:])) is not None)
    return FollowUp(verdict, bool(SAME_WORK.search(rest) or pointing or (said and verdict is None)))


def _says(clause: str) -> bool:
    return any(pattern.search(clause) for pattern in (WORKED, FAILED, NOT_FAILED))
