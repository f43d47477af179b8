"""Did the chat template render a conversation exactly: every turn's text, every tool call, result and
definition present in its output? One rule for the plan's pass over every row (launcher/plan/tokencount.py,
Jinja without torch) and the training's tokenizing (train/dataset/chat.py): a row a template would
trim (an assistant's text beside its `tool_calls`, a second parallel call) or refuse (roles that do not
alternate) is found before the queue, by row, instead of being trained on changed or skipped. Torch-free.
"""

from __future__ import annotations

import json
import re
from typing import Any

# A reasoning block written at the start of an assistant's content: Qwen3's template renders it for the turns
# after the last user query only (as at inference), so an earlier turn's is dropped by design, not trimmed.
LEADING_REASONING = re.compile(r"^<think>.*?</think>", re.S)


def unrendered_part(rendered: str, messages: list[dict[str, Any]], tools: list[dict] | None = None) -> str | None:
    """The first tool definition, turn text, tool call or tool result the rendering lacks (None: all there).
    Text is looked for whitespace-trimmed; a tool result may be rendered as it is or serialised (Llama
    3.1-3.3 write it through `tojson`)."""
    defined = set()
    for tool in tools or []:
        name = (tool.get("function") or tool).get("name")
        defined.add(name)
        if isinstance(name, str) and name not in rendered:
            return f"tool definition {name!r}"
    calls: dict[str, int] = {}
    for index, message in enumerate(messages):
        content = message.get("content")
        text = content.strip() if isinstance(content, str) else ""
        if message["role"] == "assistant":  # its reasoning block is the template's to render or drop (docs/data.md)
            text = LEADING_REASONING.sub("", text, count=1).strip()
        if text and not any(form in rendered for form in renderings(text)):
            what = "tool result" if message["role"] == "tool" else f"{message['role']} text"
            return f"messages[{index}]: {what} {text[:40]!r}"
        for call in message.get("tool_calls") or []:
            name = call["function"]["name"]
            calls[name] = calls.get(name, 0) + 1
            # each call writes its name once more than the definitions do (a dropped parallel call shows here)
            if rendered.count(name) < calls[name] + (name in defined):
                return f"messages[{index}]: tool call {name!r} (call {calls[name]} of that name)"
    return None


def renderings(content: str) -> list[str]:
    """How a template may write a text: as it is, or as a JSON string (`tojson`, whose HTML-safe form
    escapes <, >, &, ')."""
    quoted = [json.dumps(content, ensure_ascii=False), json.dumps(content)]
    safe = [q.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026").replace("'", "\\u0027")
            for q in quoted]
    return [content, *(q[1:-1] for q in quoted), *(q[1:-1] for q in safe)]
