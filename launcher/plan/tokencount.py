"""Counting a source's tokens with the model's own tokenizer, on the login node and without torch.

The plan's steps, ETA and each source's share rest on the token count, and characters / 3.5
(launcher/plan/datasize.py) misses by 2-3x on chat data (the template's headers, a system block per
conversation, the vocabulary). So, where the model's `tokenizer.json` is at hand: the first
SAMPLE_ROWS rows of the source go through `contract.formats.parse_row` (the training's parser), each
is rendered with the tokenizer's chat template the way transformers' `apply_chat_template` renders it
(Jinja, sandboxed, trim_blocks / lstrip_blocks, its `tojson`, `raise_exception`, `strftime_now`;
`{% generation %}` marks nothing here) and encoded with `tokenizers` (Rust, torch-free); text rows
are BOS + text + EOS and pre-tokenized rows their length. The count keeps each row's length before the
cut, so one count serves any model_max_length: the tokens (each row truncated as the training truncates,
the sample's mean per row x the source's rows), the rows longer than it, and the longest.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from pathlib import Path
from typing import Any

from contract.formats import Example, RowMapping, good_examples
from contract.readers import RawRow
from contract.rendercheck import unrendered_part

SAMPLE_ROWS = 1000  # rows counted per source (the first ones); the rest are assumed alike
ENCODE_BATCH = 256


@dataclass(frozen=True)
class TokenCount:
    lengths: list[int]  # tokens of each row counted (good rows; bad ones are the check's business), uncut
    complete: bool  # every row of the source was counted

    @property
    def rows(self) -> int:
        return len(self.lengths)

    @property
    def longest(self) -> int:
        return max(self.lengths, default=0)

    def tokens(self, max_length: int) -> int:
        """Of the rows counted, each truncated to `max_length` as the training truncates it."""
        return sum(min(n, max_length) for n in self.lengths)

    def longer(self, max_length: int) -> int:
        """Rows counted that the training would cut to `max_length`."""
        return sum(1 for n in self.lengths if n > max_length)


class CountingTokenizer:
    """A model directory's tokenizer.json and chat template, loaded without transformers."""

    def __init__(self, directory: Path):
        from tokenizers import Tokenizer  # Rust; torch-free

        self.directory = directory
        self.tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
        config = _json(directory / "tokenizer_config.json")
        self.specials = {name: _token_text(config.get(name)) for name in ("bos_token", "eos_token", "pad_token",
                                                                           "unk_token")}
        self.template = _chat_template(directory, config)

    @cached_property
    def _compiled(self) -> Any:
        import jinja2
        from jinja2.ext import Extension, loopcontrols
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        class Generation(Extension):  # `{% generation %}...{% endgeneration %}`: only its body
            tags = {"generation"}

            def parse(self, parser: Any) -> Any:
                next(parser.stream)
                return parser.parse_statements(("name:endgeneration",), drop_needle=True)

        def raise_exception(message: str) -> None:
            raise jinja2.exceptions.TemplateError(message)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[Generation, loopcontrols])
        env.filters["tojson"] = lambda x, ensure_ascii=False, indent=None, separators=None, sort_keys=False: \
            json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
        env.globals |= {"raise_exception": raise_exception, "strftime_now": lambda f: datetime.now().strftime(f)}
        return env.from_string(self.template)

    def _text(self, example: Example) -> str | None:
        """What the training tokenizes for `example` (None: a pre-tokenized row, or a template that fails it)."""
        if example.text is not None:
            return example.text
        if example.messages is None or not self.template:
            return None
        try:
            return self._compiled.render(messages=example.messages, tools=example.tools, add_generation_prompt=False,
                                         **{k: v for k, v in self.specials.items() if v is not None})
        except Exception:  # the template refuses the row: the training skips it too (the mask check says why)
            return None

    def render_problem(self, example: Example) -> str | None:
        """Why the template cannot render a chat example exactly (contract/rendercheck.py); None: it can."""
        if example.messages is None:
            return None
        try:
            rendered = self._compiled.render(messages=example.messages, tools=example.tools,
                                             add_generation_prompt=False,
                                             **{k: v for k, v in self.specials.items() if v is not None})
        except Exception as err:  # jinja's raise_exception ("roles must alternate", "only one tool call")
            reason = str(err).strip().splitlines()[0].strip("'\"") if str(err).strip() else repr(err)
            return f"the chat template refuses it: {reason}"
        missing = unrendered_part(rendered, example.messages, example.tools)
        return f"the chat template leaves out {missing}" if missing else None

    def count(self, examples: list[Example]) -> list[int]:
        """Tokens of each example as the training would have them, before the cut to model_max_length."""
        texts = [self._text(example) for example in examples]
        encoded = iter(self.tokenizer.encode_batch([t for t in texts if t is not None], add_special_tokens=False))
        counts = []
        ends = sum(self.specials[name] is not None for name in ("bos_token", "eos_token"))
        for example, text in zip(examples, texts):
            if example.tokens is not None:
                counts.append(len(example.tokens[0]))
            elif text is None:
                continue
            else:
                counts.append(len(next(encoded).ids) + (ends if example.text is not None else 0))
        return counts


def count_rows(rows: Iterable[RawRow], fmt: str, text_field: str, mapping: RowMapping, tokenizer: CountingTokenizer,
               sample: int = SAMPLE_ROWS) -> TokenCount:
    """Tokens of the first `sample` good rows of a source."""
    examples: list[Example] = []
    complete = True
    for _, example in good_examples(rows, fmt, text_field, mapping):
        if len(examples) >= sample:
            complete = False
            break
        examples.append(example)
    counts = [n for start in range(0, len(examples), ENCODE_BATCH)
              for n in tokenizer.count(examples[start:start + ENCODE_BATCH])]
    return TokenCount(counts, complete)


@dataclass
class RenderCheck:
    """Every good chat row of a source rendered by the model's template: the rows it cannot render exactly."""

    rows: int = 0  # good rows rendered
    unrenderable: int = 0
    problems: list[str] = field(default_factory=list)  # the first MAX_LISTED_PROBLEMS, "location: reason"


MAX_LISTED_PROBLEMS = 5


def check_rendering(rows: Iterable[RawRow], fmt: str, text_field: str, mapping: RowMapping,
                    tokenizer: CountingTokenizer) -> RenderCheck:
    """Render every good row (bad rows are the data check's business) and keep the ones the template cannot
    render exactly, by location: the training would skip or trim them."""
    check = RenderCheck()
    for raw, example in good_examples(rows, fmt, text_field, mapping):
        check.rows += 1
        if (problem := tokenizer.render_problem(example)) is not None:
            check.unrenderable += 1
            if len(check.problems) < MAX_LISTED_PROBLEMS:
                check.problems.append(f"{raw.location}: {problem}")
    return check


def _json(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def _token_text(value: Any) -> str | None:
    """A special token as tokenizer_config.json gives it: its text, or {"content": text, ...}."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _chat_template(directory: Path, config: dict[str, Any]) -> str:
    """The default chat template, where transformers looks: chat_template.jinja, .json, tokenizer_config.json."""
    if (directory / "chat_template.jinja").is_file():
        return (directory / "chat_template.jinja").read_text(encoding="utf-8")
    template = _json(directory / "chat_template.json").get("chat_template") or config.get("chat_template") or ""
    if isinstance(template, list):  # named templates: the default one
        template = next((t.get("template", "") for t in template if t.get("name") == "default"), "")
    return template if isinstance(template, str) else ""
