"""Tokenizing one example into (input_ids, labels) with loss only where the model must generate.

Chat examples go through the tokenizer's own chat template. The assistant mask comes from the
template itself, never from a hard-coded offset (FastChat's "-2" breaks as soon as a template
changes):
  1. templates with `{% generation %}` markers: `return_assistant_tokens_mask=True` marks exactly
     the generated span (the tiny tokenizer marks the reply plus its end-of-turn token);
  2. otherwise, turn by turn: render the conversation up to the assistant turn with the generation
     prompt, then including that turn; the appended text is the assistant's: its reply and its
     end-of-turn token (</s>, <|eot_id|>, <|im_end|>: the model must learn to stop), without the
     whitespace some templates put between turns after that token (Qwen's "<|im_end|>\n"), which
     the model never generates. This is only trusted if every rendered prefix is an exact prefix of
     the whole rendering (the pieces re-join) and no token of the whole straddles a prompt/reply
     boundary; if not, MaskError and the caller skips the example (counted in the data stats).
     Templates that render the last assistant turn differently from earlier ones (Qwen3 writes the
     reasoning only after the last user query; gpt-oss ends the last turn with <|return|> and its
     analysis, earlier ones with <|end|> and none) are measured as the whole renders them:
     `_turn_as_history` renders an earlier turn with a turn after it.
Plain text examples get BOS + text + EOS with loss on every token.
"""

from __future__ import annotations

import re

from transformers import PreTrainedTokenizerBase

from contract.rendercheck import unrendered_part

IGNORE_INDEX = -100  # label value that transformers' causal-LM loss ignores
_GENERATION_TAG = re.compile(r"{%-?\s*generation\s*-?%}")


class MaskError(ValueError):
    """The assistant mask of an example cannot be computed reliably."""


def has_generation_markers(tokenizer: PreTrainedTokenizerBase) -> bool:
    template = tokenizer.chat_template
    if isinstance(template, dict):  # named templates: the default one is what apply_chat_template uses
        template = template.get("default", "")
    return bool(template) and bool(_GENERATION_TAG.search(template))


def tokenize_chat(
    tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, str]], use_generation_markers: bool,
    tools: list[dict] | None = None,
) -> tuple[list[int], list[int]]:
    """(input_ids, labels) of a conversation, untruncated, `tools` (definitions) given to the template as its
    `tools` argument; raises MaskError."""
    if not tokenizer.chat_template:
        raise MaskError("the tokenizer has no chat template")
    if use_generation_markers:
        _require_exact(_render(tokenizer, messages, prompt=False, tools=tools), messages, tools)
        input_ids, mask = _mask_from_generation_markers(tokenizer, messages, tools)
    else:
        input_ids, mask = _mask_turn_by_turn(tokenizer, messages, tools)
    if not any(mask):
        raise MaskError("no assistant token found by the template")
    labels = [tok if keep else IGNORE_INDEX for tok, keep in zip(input_ids, mask)]
    return input_ids, labels


def tokenize_text(tokenizer: PreTrainedTokenizerBase, text: str) -> tuple[list[int], list[int]]:
    """(input_ids, labels) of plain text: BOS (if the tokenizer has one) + text + EOS, loss everywhere."""
    ids = _encode(tokenizer, text)
    if tokenizer.bos_token_id is not None:
        ids = [tokenizer.bos_token_id, *ids]
    if tokenizer.eos_token_id is not None:
        ids.append(tokenizer.eos_token_id)
    return ids, list(ids)


def _encode(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    # The chat template already writes BOS; apply_chat_template also tokenizes this way.
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def _require_exact(rendered: str, messages: list[dict[str, str]], tools: list[dict] | None) -> None:
    """Every turn's text and tool call is in the rendering (contract/rendercheck.py, the plan's rule too)."""
    if missing := unrendered_part(rendered, messages, tools):
        raise MaskError(f"the chat template leaves out {missing}")


def _render(tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, str]], prompt: bool,
            tools: list[dict] | None = None) -> str:
    try:
        return tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=prompt)
    except Exception as err:  # jinja raise_exception(...) in templates, e.g. "roles must alternate"
        raise MaskError(f"chat template failed: {err}") from None


def _mask_from_generation_markers(
    tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, str]], tools: list[dict] | None = None
) -> tuple[list[int], list[int]]:
    try:
        out = tokenizer.apply_chat_template(
            messages, tools=tools, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
        )
    except Exception as err:
        raise MaskError(f"chat template failed: {err}") from None
    input_ids, mask = list(out["input_ids"]), list(out["assistant_masks"])
    spans = sum(1 for prev, cur in zip([0, *mask], mask) if cur and not prev)
    n_assistant = sum(m["role"] == "assistant" for m in messages)
    if spans < n_assistant:
        # Adjacent assistant turns would merge into one span, but fewer spans than turns in a
        # normal conversation means the template skipped (or the offsets lost) a reply.
        if not _has_adjacent_assistant_turns(messages):
            raise MaskError(f"template marked {spans} assistant span(s) for {n_assistant} assistant turn(s)")
    return input_ids, mask


def _has_adjacent_assistant_turns(messages: list[dict[str, str]]) -> bool:
    return any(a["role"] == b["role"] == "assistant" for a, b in zip(messages, messages[1:]))


def _mask_turn_by_turn(
    tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, str]], tools: list[dict] | None = None
) -> tuple[list[int], list[int]]:
    """Mask from rendering prefixes: each assistant turn is the text that rendering it appends.

    The text pieces must re-join exactly (each prefix is a prefix of the whole rendering), and the
    whole is tokenized once: tokenizing a prompt that ends in "\n\n" on its own can merge
    whitespace differently than inside the whole, so the reply's token span is found through
    character offsets, and a token straddling a prompt/reply boundary makes the mask unreliable.
    """
    full_text = _render(tokenizer, messages, prompt=False, tools=tools)
    _require_exact(full_text, messages, tools)
    if not getattr(tokenizer, "is_fast", False):
        raise MaskError("turn-by-turn masks need a fast tokenizer (character offsets)")
    encoded = tokenizer(full_text, add_special_tokens=False, return_offsets_mapping=True)
    input_ids, offsets = list(encoded["input_ids"]), list(encoded["offset_mapping"])
    mask = [0] * len(input_ids)
    for index, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        before = _render(tokenizer, messages[:index], prompt=True, tools=tools)
        after = _render(tokenizer, messages[: index + 1], prompt=False, tools=tools)
        if not full_text.startswith(after) and index + 1 < len(messages):
            after = _turn_as_history(tokenizer, messages, index, tools, full_text)
        if not (after.startswith(before) and full_text.startswith(after)) or len(after) == len(before):
            raise MaskError(f"turn {index}: the template renders a prefix differently from the whole")
        _mark_reply(mask, offsets, len(before), len(after), len(after.rstrip()), index)
    return input_ids, mask


_PROBE = "sft-launch probe: a later turn"


def _turn_as_history(tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, str]], index: int,
                     tools: list[dict] | None, full_text: str) -> str:
    """The rendering through assistant turn `index` as the whole conversation renders it (a later turn
    follows), for templates that render the last turn differently; "" when neither way matches the whole.

    gpt-oss renders the turn as an earlier one when a generation prompt follows it: that rendering less
    the prompt. Qwen3 drops the reasoning of turns before the last user query: a user turn after it
    does that, and the rendering less that user turn's block (as it renders alone) is the turn's end."""
    before_prompt = _render(tokenizer, messages[:index], prompt=True, tools=tools)
    plain = _render(tokenizer, messages[:index], prompt=False, tools=tools)
    prompt = before_prompt[len(plain):] if before_prompt.startswith(plain) else ""
    prompted = _render(tokenizer, messages[: index + 1], prompt=True, tools=tools)
    if prompt and prompted.endswith(prompt) and full_text.startswith(prompted[: -len(prompt)]):
        return prompted[: -len(prompt)]
    probe = {"role": "user", "content": _PROBE}
    followed = _render(tokenizer, [*messages[: index + 1], probe], prompt=False, tools=tools)
    block = _render(tokenizer, [probe], prompt=False)
    if followed.endswith(block) and full_text.startswith(followed[: -len(block)]):
        return followed[: -len(block)]
    return ""


def _mark_reply(
    mask: list[int], offsets: list[tuple[int, int]], first: int, last: int, learned_end: int, index: int
) -> None:
    """Set mask=1 on the tokens of one reply: characters [first, last) of the whole rendering.

    Tokens that start in [learned_end, last), the template's whitespace after the end-of-turn
    token, stay unlearned; a token that starts inside the reply and runs into that whitespace is
    learned (the reply needs it). A token crossing `first` or `last` belongs to two turns.
    """
    learned_end = max(learned_end, first)
    for token, (start, end) in enumerate(offsets):
        if start < first < end or start < last < end:
            raise MaskError(f"turn {index}: a token straddles the prompt/reply boundary")
        if first <= start < learned_end and end > start:
            mask[token] = 1
