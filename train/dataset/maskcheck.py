"""Can this tokenizer mask the data's conversations? Asked by the launcher before it submits.

    python -m train.dataset.maskcheck TOKENIZER_DIR DATA_PATH FORMAT
exits 0 when the tokenizer loads and `train.dataset.chat.tokenize_chat` (the training code) finds the
assistant tokens of at least one of the first SAMPLES good rows, else 2 with one line naming why.
A separate process: transformers imports torch (seconds), and the launcher itself never does.
"""

from __future__ import annotations

import sys
from pathlib import Path

from contract.formats import BadRowError, detect_format, iter_rows, parse_row
from contract.schema import ConfigError

SAMPLES = 8  # good chat rows tried before the tokenizer is declared unable to mask


def first_chat_examples(path: Path, fmt: str, count: int) -> list[list[dict[str, str]]]:
    """The messages of the first `count` good chat rows (none for text / pre-tokenized data)."""
    examples: list[list[dict[str, str]]] = []
    for raw in iter_rows(path):
        if fmt == "auto" and not raw.error:
            fmt = detect_format(raw.data, "text", raw.location)
        try:
            example = parse_row(raw, fmt, "text")
        except BadRowError:
            continue
        if example.messages is None:
            return []
        examples.append(example.messages)
        if len(examples) >= count:
            break
    return examples


def check(tokenizer_dir: str, data: Path, fmt: str) -> str | None:
    """None when a sample masks; else the reason, one line."""
    from transformers import AutoTokenizer

    from train.dataset.chat import MaskError, has_generation_markers, tokenize_chat

    try:
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir, local_files_only=True)
    except (OSError, ValueError) as err:
        return f"cannot load the tokenizer: {str(err).strip().splitlines()[0] if str(err).strip() else err!r}"
    reasons = []
    for messages in first_chat_examples(data, fmt, SAMPLES):
        try:
            tokenize_chat(tokenizer, messages, has_generation_markers(tokenizer))
            return None
        except MaskError as err:
            reasons.append(str(err))
    return f"cannot mask the assistant turns of the first {len(reasons)} rows: {reasons[0]}" if reasons else None


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: python -m train.dataset.maskcheck TOKENIZER_DIR DATA_PATH FORMAT", file=sys.stderr)
        return 2
    try:
        reason = check(argv[0], Path(argv[1]), argv[2])
    except ConfigError as err:
        reason = str(err)
    if reason:
        print(reason, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
