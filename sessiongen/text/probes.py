"""Correctness probes: the needle facts a session plants, and how answers are graded.

A needle is a fact planted in a session's context ("The access code of vault 41 is
9317.") and asked back in a later turn ("What is the access code of vault 41? Reply
with the number only."). The session builder plants and asks; the simulated replicas
answer the way a healthy model would (:func:`answer_needle`); the runner grades the
first number of an answer against the planted value (:func:`grade`). Keeping the
phrasing here, once, below the workload and the simulator, is what lets all three agree.
"""

from __future__ import annotations

import re

NEEDLE_QUESTION = "What is the access code of vault {vault}? Reply with the number only."
NEEDLE_FACT = " The access code of vault {vault} is {code}."
_NEEDLE_Q_RE = re.compile(r"What is the access code of vault (\d+)\?")


def answer_needle(prompt_text: str) -> str | None:
    """The planted answer to the last needle question in ``prompt_text``, if any."""
    asked = _NEEDLE_Q_RE.findall(prompt_text)
    if not asked:
        return None
    vault = asked[-1]
    fact = re.search(rf"The access code of vault {vault} is (\d+)\.", prompt_text)
    return fact.group(1) if fact else None


def first_number(text: str) -> str | None:
    """The first run of digits in ``text``, if any."""
    found = re.search(r"\d+", text)
    return found.group(0) if found else None


def grade(expected: str | None, answer: str) -> bool | None:
    """Whether an answer gives the planted value (None when nothing was asked)."""
    if expected is None:
        return None
    return first_number(answer) == expected
