"""Can this tokenizer mask (and render) the data's conversations? Asked by the launcher before it submits.

    python -m train.dataset.maskcheck TOKENIZER_DIR SOURCES_JSON
SOURCES_JSON lists each chat source: {path, format, text_field, split, config, hf_home, mapping,
tool_row, skip_unrenderable}. Exits 0 when the tokenizer loads, `train.dataset.chat.tokenize_chat` (the training code) finds
the assistant tokens of at least one of each source's first SAMPLES good rows, and a template asked
to render tool calls shows every call and every tool result; else 2 with one line naming why.
A separate process: transformers imports torch (seconds), and the launcher itself never does.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from contract.formats import Example, RowMapping, good_examples
from contract.protocol import EXIT_OK, EXIT_USAGE
from contract.readers import RawRow, iter_hub_rows, iter_rows
from contract.rendercheck import unrendered_part
from contract.schema import ConfigError

SAMPLES = 8  # good chat rows tried before the tokenizer is declared unable to mask


def _rows(sample: dict[str, Any]) -> Iterator[RawRow]:
    path = Path(sample["path"])
    if path.exists():
        return iter_rows(path, sample.get("split", "train"))
    return iter_hub_rows(sample["path"], sample.get("config", ""), sample.get("split", "train"),
                         sample.get("hf_home", ""), "data")


def first_chat_examples(sample: dict[str, Any], count: int) -> tuple[list[Example], list[tuple[str, Example]]]:
    """The first `count` good chat rows, and (location, example) of the first rows with tool calls."""
    fmt, text_field = sample.get("format", "auto"), sample.get("text_field", "text")
    mapping = RowMapping(**sample.get("mapping", {}))
    examples: list[Example] = []
    tools: list[tuple[str, Example]] = []
    for raw, example in good_examples(_rows(sample), fmt, text_field, mapping):
        if example.messages is None:
            return [], []
        if example.has_tool_calls and len(tools) < count:
            tools.append((raw.location, example))
        if len(examples) < count:
            examples.append(example)
        if len(examples) >= count and (len(tools) >= count or not sample.get("tool_row")):
            break
    return examples, tools


def check_source(tokenizer: Any, sample: dict[str, Any]) -> str | None:
    """None when a sample masks and every tool call renders; else the reason, one line."""
    from train.dataset.chat import MaskError, has_generation_markers, tokenize_chat

    examples, tools = first_chat_examples(sample, SAMPLES)
    markers = has_generation_markers(tokenizer)
    reasons = []
    for example in examples:
        try:
            tokenize_chat(tokenizer, example.messages, markers, example.tools)
            break
        except MaskError as err:
            reasons.append(str(err))
    else:
        if reasons:
            return f"cannot mask the assistant turns of the first {len(reasons)} rows of {sample['path']}: {reasons[0]}"
    for location, example in tools:
        try:
            rendered = tokenizer.apply_chat_template(example.messages, tools=example.tools, tokenize=False)
            tokenize_chat(tokenizer, example.messages, markers, example.tools)
        except Exception as err:  # jinja's raise_exception, MaskError
            if sample.get("skip_unrenderable"):
                continue  # skipped and counted (launcher/resolve/datarules.py)
            return f"{location}: the chat template cannot render this conversation with tool calls: {err}"
        missing = unrendered_part(rendered, example.messages, example.tools)
        if missing and not sample.get("skip_unrenderable"):
            return (f"{location}: the chat template does not render tool calls ({missing} is missing from its "
                    "output); use a tool-calling model's tokenizer (model.tokenizer) or drop the tool rows")
    return None


def check(tokenizer_dir: str, samples: list[dict[str, Any]]) -> str | None:
    """None when every source's sample masks; else the reason, one line."""
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir, local_files_only=True)
    except (OSError, ValueError) as err:
        return f"cannot load the tokenizer: {str(err).strip().splitlines()[0] if str(err).strip() else err!r}"
    for sample in samples:
        reason = check_source(tokenizer, sample)
        if reason:
            return reason
    return None


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m train.dataset.maskcheck TOKENIZER_DIR SOURCES_JSON", file=sys.stderr)
        return EXIT_USAGE
    try:
        reason = check(argv[0], json.loads(argv[1]))
    except ConfigError as err:
        reason = str(err)
    if reason:
        print(reason, file=sys.stderr)
        return EXIT_USAGE
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
