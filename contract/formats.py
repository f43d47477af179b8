"""Normalising dataset rows (as `contract.readers` reads them) into chat messages, plain text or tokens.

Formats (the column names are the defaults; a source's `columns` maps them to the data's own):
  sharegpt           {"conversations": [{"from": "system|human|gpt", "value": ...}, ...]}  (FastChat)
  messages           {"messages": [{"role": "system|user|assistant|tool", "content": ...}, ...]}  (OpenAI;
                     assistant turns may carry `tool_calls` and their reasoning as `reasoning_content`
                     (Qwen3's template) or `thinking` (gpt-oss's), tool turns `tool_call_id` / `name`)
  alpaca             {"instruction": ..., "input": ... (optional), "output": ..., "system": ... (optional)}
  prompt_completion  {"prompt": ..., "completion": ...}  (TRL): strings become a user and an assistant
                     turn; lists of messages are taken as they are
  text               {<text_field>: ...}  — loss on every token
  tokens             {"input_ids": [...], "labels": [...] (optional, -100 = no loss; absent = loss everywhere)}
                     — pre-tokenized (benchmarks, or data tokenized elsewhere); used as is
A source's `roles` maps the data's role names onto system/user/assistant/tool, or onto `tool_call`: an
assistant turn whose content is the call as JSON ({"name": ..., "arguments": {...}} or a list of them),
made into OpenAI `tool_calls` (ShareGPT's function-calling layout: `function_call` and `observation`
turns, mapped to tool_call and tool by default). Its `system_prompt` becomes the first turn of every
conversation that has none. Tool definitions (a `tools` column of sharegpt / messages rows, a list or
its JSON text, else the source's `tools` file) go to the chat template's `tools` argument.

One implementation for both sides: `train.dataset.load` tokenizes what `parse_row` returns, and the
launcher's pre-submission check (`contract.datacheck`) runs every row through the same `parse_row`
on the login node. Torch-free.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from contract.readers import RawRow
from contract.schema import ConfigError

FORMATS = ("sharegpt", "messages", "alpaca", "prompt_completion", "text", "tokens")
ROLES = ("system", "user", "assistant", "tool")
TOOL_CALL = "tool_call"  # a role mapped to it: an assistant turn whose content is the call's JSON
MAPPED_ROLES = (*ROLES, TOOL_CALL)
SHAREGPT_ROLES = {"system": "system", "human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                  "function_call": TOOL_CALL, "observation": "tool"}
MESSAGE_ROLES = {role: role for role in ROLES}
# The columns each format reads (a source's `columns` may rename any of them).
COLUMNS = {
    "sharegpt": ("conversations", "from", "value", "tools"),
    "messages": ("messages", "role", "content", "tools"),
    "alpaca": ("instruction", "input", "output", "system"),
    "prompt_completion": ("prompt", "completion", "system"),
    "text": ("text",),
    "tokens": ("input_ids", "labels"),
}
CHAT_FORMATS = ("sharegpt", "messages", "alpaca", "prompt_completion")


class BadRowError(ValueError):
    """A row that cannot be used; the message names its location."""


@dataclass(frozen=True)
class RowMapping:
    """How one source's rows differ from a format's defaults (a `[[data.sources]]` table's mapping)."""

    columns: dict[str, str] = field(default_factory=dict)  # the format's column name -> the data's
    roles: dict[str, str] = field(default_factory=dict)  # the data's role name -> system/user/assistant/tool/tool_call
    system_prompt: str = ""
    tools: list[Any] = field(default_factory=list)  # tool definitions of rows without a tools column (the source's file)

    def column(self, name: str) -> str:
        return self.columns.get(name, name)


NO_MAPPING = RowMapping()


@dataclass
class Example:
    """One normalised row: chat `messages` ({role, content}, + tool fields), plain `text`, or `tokens`."""

    messages: list[dict[str, Any]] | None = None
    text: str | None = None
    tokens: tuple[list[int], list[int]] | None = None  # (input_ids, labels), already tokenized
    tools: list[dict[str, Any]] | None = None  # tool definitions, for the chat template's `tools` argument

    @property
    def has_tool_calls(self) -> bool:
        return bool(self.tools) or any(m.get("tool_calls") or m["role"] == "tool" for m in self.messages or [])


def detect_format(row: Any, text_field: str, location: str, mapping: RowMapping = NO_MAPPING) -> str:
    """The format of a dataset, judged from its first row's keys (through the source's column mapping)."""
    if isinstance(row, dict):
        col = mapping.column
        if col("conversations") in row:
            return "sharegpt"
        if col("messages") in row:
            return "messages"
        if col("instruction") in row and col("output") in row:
            return "alpaca"
        if col("prompt") in row and col("completion") in row:
            return "prompt_completion"
        if mapping.columns.get("text", text_field) in row:
            return "text"
        if col("input_ids") in row:
            return "tokens"
    keys = sorted(row) if isinstance(row, dict) else type(row).__name__
    raise ConfigError(
        f"{location}: cannot detect data.format from keys {keys}; expected 'conversations', 'messages', "
        f"'instruction'+'output', 'prompt'+'completion' or the text field {text_field!r} (set data.format / "
        "data.text_field, or a source's format and columns)",
        "data.format",
    )


def parse_row(raw: RawRow, fmt: str, text_field: str, mapping: RowMapping = NO_MAPPING) -> Example:
    """A row as read (`contract.readers`) validated and normalised; raises BadRowError(reason).

    The one check both sides run: train before tokenizing, the launcher before submitting."""
    if raw.error:
        raise BadRowError(raw.error)
    return normalize(raw.data, fmt, text_field, mapping)


def good_examples(rows: Iterable[RawRow], fmt: str, text_field: str,
                  mapping: RowMapping = NO_MAPPING) -> Iterator[tuple[RawRow, Example]]:
    """(row, example) of each row that parses, the format detected on the first readable row when `fmt` is "auto";
    bad rows are skipped (they are the data check's to report)."""
    for raw in rows:
        if fmt == "auto" and not raw.error:
            fmt = detect_format(raw.data, text_field, raw.location, mapping)
        try:
            yield raw, parse_row(raw, fmt, text_field, mapping)
        except BadRowError:
            continue


def normalize(row: Any, fmt: str, text_field: str, mapping: RowMapping = NO_MAPPING) -> Example:
    """Validate one decoded row and turn it into an Example; raises BadRowError(reason)."""
    if not isinstance(row, dict):
        raise BadRowError(f"expected a JSON object, got {type(row).__name__}")
    if fmt == "text":
        return Example(text=_required_text(row, mapping.columns.get("text", text_field)))
    if fmt == "tokens":
        return Example(tokens=_token_lists(row, mapping))
    if fmt == "alpaca":
        messages = _alpaca_messages(row, mapping)
    elif fmt == "prompt_completion":
        messages = _prompt_completion_messages(row, mapping)
    else:
        messages = _chat_messages(row, fmt, mapping)
    if mapping.system_prompt and messages[0]["role"] != "system":
        messages.insert(0, {"role": "system", "content": mapping.system_prompt})
    _check_conversation(messages)
    tools = _tools(row.get(mapping.column("tools")), mapping.column("tools")) if fmt in ("sharegpt", "messages") else None
    return Example(messages=messages, tools=tools or _tools(mapping.tools, "tools (the source's file)"))


def _tools(value: Any, key: str) -> list[dict[str, Any]] | None:
    """Tool definitions in OpenAI's form ({"type": "function", "function": {name, ...}}), from a list or its
    JSON text, each given in that form or as the bare function {name, description, parameters}."""
    if isinstance(value, str):
        if not value.strip():
            return None
        try:
            value = json.loads(value)
        except json.JSONDecodeError as err:
            raise BadRowError(f"field {key!r} is not JSON ({err.msg}, column {err.colno})") from None
    if not value:
        return None
    if not isinstance(value, list):
        value = [value]
    tools = []
    for number, tool in enumerate(value):
        function = tool.get("function", tool) if isinstance(tool, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str) or not function["name"]:
            raise BadRowError(f"{key}[{number}] needs a name (a function definition)")
        tools.append({"type": "function", "function": function})
    return tools


def _required_text(row: dict, key: str, allow_empty: bool = False) -> str:
    if key not in row or row[key] is None:
        raise BadRowError(f"missing field {key!r}")
    value = row[key]
    if not isinstance(value, str):
        raise BadRowError(f"field {key!r} must be a string, got {type(value).__name__}")
    if not allow_empty and not value.strip():
        raise BadRowError(f"field {key!r} is empty")
    _check_encodable(value, key)
    return value


def _check_encodable(value: str, key: str) -> None:
    # JSON escapes can smuggle in lone surrogates ("\ud800") that no tokenizer can encode.
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise BadRowError(f"field {key!r} is not valid UTF-8 (lone surrogate)") from None


def _required_list(row: dict, key: str) -> list:
    value = row.get(key)
    if not isinstance(value, list) or not value:
        raise BadRowError(f"field {key!r} must be a non-empty list")
    return value


def _chat_messages(row: dict, fmt: str, mapping: RowMapping) -> list[dict[str, Any]]:
    """sharegpt / messages rows: each turn's role mapped, its content checked, tool fields kept."""
    list_key, role_key, content_key = (mapping.column(name) for name in COLUMNS[fmt][:3])
    defaults = SHAREGPT_ROLES if fmt == "sharegpt" else MESSAGE_ROLES
    roles = {**defaults, **mapping.roles}
    shown = (["system", "human", "gpt", "function_call", "observation"] if fmt == "sharegpt" else list(ROLES)) + \
        [name for name in mapping.roles if name not in defaults]
    messages = []
    for index, turn in enumerate(_required_list(row, list_key)):
        where = f"{list_key}[{index}]"
        if not isinstance(turn, dict) or role_key not in turn or content_key not in turn:
            raise BadRowError(f"{where} needs {role_key!r} and {content_key!r}")
        role = roles.get(turn[role_key]) if isinstance(turn[role_key], str) else None
        if role is None:
            raise BadRowError(f"{where}: unknown role {turn[role_key]!r} (valid: {', '.join(shown)})")
        messages.append(_turn(turn, role, content_key, where))
    return messages


# An assistant turn's reasoning, under the names chat templates read it by (Qwen3: reasoning_content,
# gpt-oss: thinking); kept so the template decides what of it is rendered and learned.
REASONING_KEYS = ("reasoning_content", "thinking")


def _turn(turn: dict, role: str, content_key: str, where: str) -> dict[str, Any]:
    """One message: {role, content} plus an assistant's `tool_calls` and reasoning, or a tool result's id and
    name."""
    if role == TOOL_CALL:
        return {"role": "assistant", "content": "", "tool_calls": _tool_calls(_call_json(turn, content_key, where), where)}
    reasoning = {key: _required_text(turn, key, allow_empty=True) for key in REASONING_KEYS
                 if role == "assistant" and turn.get(key) is not None}
    calls = turn.get("tool_calls") if role == "assistant" else None
    if calls is not None and calls != []:  # `tool_calls: []` (as many exports write it): no call
        message: dict[str, Any] = {"role": role, "tool_calls": _tool_calls(calls, where)}
        message["content"] = _required_text(turn, content_key, allow_empty=True) if turn.get(content_key) else ""
        return message | reasoning
    message = {"role": role, "content": _required_text(turn, content_key, allow_empty=role != "assistant")} | reasoning
    if role == "tool":
        message |= {key: _required_text(turn, key) for key in ("tool_call_id", "name") if turn.get(key) is not None}
    return message


def _call_json(turn: dict, content_key: str, where: str) -> list[dict[str, Any]]:
    """A tool_call turn's content, {"name": ..., "arguments": ...} or a list of them, as OpenAI tool calls."""
    text = _required_text(turn, content_key)
    try:
        calls = json.loads(text)
    except json.JSONDecodeError as err:
        raise BadRowError(f"{where}: the tool call is not JSON ({err.msg}, column {err.colno})") from None
    calls = calls if isinstance(calls, list) else [calls]
    return [call if not isinstance(call, dict) or "function" in call else {"function": call} for call in calls]


def _tool_calls(calls: Any, where: str) -> list[dict[str, Any]]:
    """OpenAI tool calls, arguments as a mapping (what chat templates render; a JSON string is decoded)."""
    if not isinstance(calls, list) or not calls:
        raise BadRowError(f"{where}: tool_calls must be a non-empty list")
    normalised = []
    for number, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str) or not function["name"]:
            raise BadRowError(f"{where}: tool_calls[{number}] needs function.name")
        arguments = function.get("arguments") or {}
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                raise BadRowError(f"{where}: tool_calls[{number}].function.arguments is not JSON") from None
        if not isinstance(arguments, dict):
            raise BadRowError(f"{where}: tool_calls[{number}].function.arguments must be a JSON object")
        entry: dict[str, Any] = {"type": "function", "function": {"name": function["name"], "arguments": arguments}}
        if call.get("id"):
            entry["id"] = str(call["id"])
        normalised.append(entry)
    return normalised


def _check_conversation(messages: list[dict[str, Any]]) -> None:
    if any(m["role"] == "system" for m in messages[1:]):
        raise BadRowError("a system turn may only come first")
    if not any(m["role"] == "assistant" for m in messages):
        raise BadRowError("no assistant turn (nothing to learn)")
    for previous, message in zip(messages, messages[1:]):
        if message["role"] == "tool" and not (previous["role"] == "tool" or previous.get("tool_calls")):
            raise BadRowError("a tool turn must follow an assistant turn with tool_calls")


def _alpaca_messages(row: dict, mapping: RowMapping) -> list[dict[str, Any]]:
    col = mapping.column
    instruction = _required_text(row, col("instruction"))
    extra = _required_text(row, col("input"), allow_empty=True) if row.get(col("input")) is not None else ""
    output = _required_text(row, col("output"))
    prompt = f"{instruction}\n\n{extra}" if extra.strip() else instruction
    messages = [{"role": "user", "content": prompt}, {"role": "assistant", "content": output}]
    _add_system_column(messages, row, col("system"))
    return messages


def _prompt_completion_messages(row: dict, mapping: RowMapping) -> list[dict[str, Any]]:
    """TRL's prompt-completion rows: strings (a user turn, an assistant turn) or lists of messages."""
    col = mapping.column
    prompt, completion = row.get(col("prompt")), row.get(col("completion"))
    if isinstance(prompt, list) and isinstance(completion, list):
        turns = {"messages": prompt + completion}
        return _chat_messages(turns, "messages", RowMapping(roles=mapping.roles))
    messages = [{"role": "user", "content": _required_text(row, col("prompt"))},
                {"role": "assistant", "content": _required_text(row, col("completion"))}]
    _add_system_column(messages, row, col("system"))
    return messages


def _add_system_column(messages: list[dict[str, Any]], row: dict, key: str) -> None:
    if isinstance(row.get(key), str) and row[key].strip():
        messages.insert(0, {"role": "system", "content": _required_text(row, key)})


def _token_lists(row: dict, mapping: RowMapping) -> tuple[list[int], list[int]]:
    ids_key, labels_key = mapping.column("input_ids"), mapping.column("labels")
    ids = row.get(ids_key)
    if not isinstance(ids, list) or not ids or not all(isinstance(t, int) and t >= 0 for t in ids):
        raise BadRowError(f"field {ids_key!r} must be a non-empty list of token ids")
    labels = row.get(labels_key)
    if labels is None:
        return list(ids), list(ids)
    if not isinstance(labels, list) or len(labels) != len(ids) or not all(isinstance(t, int) for t in labels):
        raise BadRowError(f"field {labels_key!r} must be a list of {len(ids)} ints (one per input id)")
    return list(ids), list(labels)
