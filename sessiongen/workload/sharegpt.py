"""ShareGPT-shaped conversation datasets read and checked, conversation by conversation.

Two layouts, told apart by the first character that is not white space:

- a JSON list (``[``) of conversations, read whole (a ShareGPT dump of 90k
  conversations is a few hundred MB: it fits, and JSON cannot be streamed by line);
- JSONL, one conversation a line, streamed; blank lines are skipped.

A conversation is an object ``{"id"?: str | int, "conversations": [turn, ...]}``
(``"messages"`` is read as well), each turn ``{"from": ROLE, "value": TEXT}`` or
``{"role": ROLE, "content": TEXT}``. Roles: ``human`` / ``user`` ask; ``gpt`` /
``assistant`` / ``chatgpt`` / ``bard`` / ``bing`` / ``model`` answer; ``system``
turns before the first question are the conversation's system prompt (joined by a
blank line). Consecutive turns of the same side are joined by a blank line, so questions
and answers alternate; answers before the first question are dropped (there is nothing
they answer). Each question is then a turn: its text, and the answer that follows it
(the last question may have none).

Every error is one line naming the file, where the conversation is (``line N`` in
JSONL, ``[N]``, 0-based, in a JSON list) and the field (``conversations[2].from``):
not JSON, not an object, a missing or mistyped field, an unknown role, a system turn
after the first question, a conversation without a question, an id seen twice, an
empty file.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import orjson

from sessiongen.errors import ScenarioError
from sessiongen.workload.jsonfile import json_lines, open_input, show

ASKS = frozenset({"human", "user"})
ANSWERS = frozenset({"gpt", "assistant", "chatgpt", "bard", "bing", "model"})
SYSTEM = "system"
_JOIN = "\n\n"


@dataclass(frozen=True, slots=True)
class ChatExchange:
    """One question of a conversation and the dataset's answer to it (None: unanswered)."""

    question: str
    answer: str | None


@dataclass(frozen=True, slots=True)
class Conversation:
    """A conversation as read: where it is in the file, its id, system prompt, exchanges."""

    where: str  # "line 4" (JSONL) or "[3]" (JSON list)
    conv_id: str | None
    system: str | None
    exchanges: tuple[ChatExchange, ...]


class _Item:
    """Field checks for one conversation; every failure names file, place and field."""

    def __init__(self, source: str, where: str, row: object) -> None:
        self.source = source
        self.where = where
        if not isinstance(row, dict):
            raise ScenarioError(source, where, f"expected a JSON object, got {show(row)}")
        self.row: dict[str, Any] = row

    def error(self, key: str, message: str) -> ScenarioError:
        return ScenarioError(self.source, f"{self.where}: {key}", message)

    def conv_id(self) -> str | None:
        value = self.row.get("id")
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, str | int) or value == "":
            raise self.error("id", f"expected a string or integer, got {show(value)}")
        return str(value)

    def turns(self) -> tuple[str, list[Any]]:
        key = "conversations" if "conversations" in self.row else "messages"
        value = self.row.get(key)
        if value is None:
            raise self.error("conversations", "missing")
        if not isinstance(value, list):
            raise self.error(key, f"expected a list of turns, got {show(value)}")
        return key, value

    def turn(self, key: str, i: int, turn: object) -> tuple[str, str]:
        """(side, text) of turn ``i``: side ``ask``, ``answer`` or ``system``."""
        at = f"{key}[{i}]"
        if not isinstance(turn, dict):
            raise self.error(at, f"expected an object with from and value, got {show(turn)}")
        role_key, text_key = ("from", "value") if "from" in turn else ("role", "content")
        role, text = turn.get(role_key), turn.get(text_key)
        if role is None:
            raise self.error(f"{at}.from", "missing")
        if text is None:
            raise self.error(f"{at}.{text_key}", "missing")
        if not isinstance(text, str):
            raise self.error(f"{at}.{text_key}", f"expected a string, got {show(text)}")
        side = _side(role)
        if side is None:
            raise self.error(
                f"{at}.{role_key}",
                f"expected human, user, gpt, assistant or system, got {show(role)}",
            )
        return side, text


def _side(role: object) -> str | None:
    if not isinstance(role, str):
        return None
    r = role.lower()
    if r in ASKS:
        return "ask"
    if r in ANSWERS:
        return "answer"
    return SYSTEM if r == SYSTEM else None


def conversation(source: str, where: str, row: object) -> Conversation:
    """One conversation checked and put into exchanges (see the module doc)."""
    item = _Item(source, where, row)
    conv_id = item.conv_id()
    key, turns = item.turns()
    system: list[str] = []
    sides: list[tuple[str, list[str]]] = []  # runs of one side: ("ask" | "answer", texts)
    for i, turn in enumerate(turns):
        side, text = item.turn(key, i, turn)
        if side == SYSTEM:
            if sides:
                raise item.error(
                    f"{key}[{i}].from", "a system turn after the first question or answer"
                )
            system.append(text)
            continue
        if side == "answer" and not any(s == "ask" for s, _ in sides):
            continue  # an answer before any question answers nothing
        if sides and sides[-1][0] == side:
            sides[-1][1].append(text)
        else:
            sides.append((side, [text]))
    if not sides:
        raise item.error(key, "no human turn (a conversation needs at least one question)")
    exchanges: list[ChatExchange] = []
    for k in range(0, len(sides), 2):
        answer = _JOIN.join(sides[k + 1][1]) if k + 1 < len(sides) else None
        exchanges.append(ChatExchange(_JOIN.join(sides[k][1]), answer))
    return Conversation(where, conv_id, _JOIN.join(system) if system else None, tuple(exchanges))


def _first_char(fh: IO[bytes]) -> bytes:
    """The first byte that is not white space (b"" for a blank file); rewinds."""
    while chunk := fh.read(65536):
        stripped = chunk.lstrip()
        if stripped:
            fh.seek(0)
            return stripped[:1]
    fh.seek(0)
    return b""


def _json_list(fh: IO[bytes], source: str) -> Iterator[Conversation]:
    try:
        rows = orjson.loads(fh.read())
    except orjson.JSONDecodeError as exc:
        raise ScenarioError(source, f"line {exc.lineno}", f"not JSON: {exc.msg}") from None
    assert isinstance(rows, list)  # the text starts with "["
    for i, row in enumerate(rows):
        yield conversation(source, f"[{i}]", row)


def _json_lines(fh: IO[bytes], source: str) -> Iterator[Conversation]:
    hint = " (JSONL holds one conversation a line; a JSON file, a list of them)"
    for number, row in json_lines(fh, source, hint):
        yield conversation(source, f"line {number}", row)


def read_conversations(path: str | Path) -> Iterator[Conversation]:
    """The dataset's conversations in file order, each checked as it is reached.

    Checks run as far as the caller reads: a caller that stops at a limit does not look
    at the rest. An id seen twice and an empty file are errors too.
    """
    source = str(path)
    with open_input(Path(path), source, "a conversation file") as fh:
        yield from _checked(fh, source)


def _checked(fh: IO[bytes], source: str) -> Iterator[Conversation]:
    rows = _json_list(fh, source) if _first_char(fh) == b"[" else _json_lines(fh, source)
    seen: dict[str, str] = {}
    count = 0
    for conv in rows:
        count += 1
        if conv.conv_id is not None:
            if conv.conv_id in seen:
                raise ScenarioError(
                    source,
                    f"{conv.where}: id",
                    f"{show(conv.conv_id)} is also the id at {seen[conv.conv_id]}",
                )
            seen[conv.conv_id] = conv.where
        yield conv
    if count == 0:
        raise ScenarioError(source, "", "the dataset is empty (no conversations)")
