"""Assistant masks under the chat templates of what people fine-tune now: Qwen3 (thinking blocks), gpt-oss
(harmony: analysis and final channels, <|return|>) and Gemma 3, tool calls through each template that has them.

The templates are the real ones (tests/fixtures/chat_templates/, sources in its README); each family gets the
shipped tiny tokenizer plus its special tokens, saved and loaded back through train.dataset.load as a run
loads it. The checks decode which tokens carry loss. What is learned, as the README documents it:
* Qwen3: each reply and its <|im_end|>. The last turn's reasoning is learned as the template writes it,
  `<think>\\n...\\n</think>\\n\\n` (an empty block when the row has none: Qwen3's non-thinking form); the template
  drops the reasoning of turns before the last user query, so theirs is neither shown nor learned.
* gpt-oss: after each `<|start|>assistant`, the channel, the message and its end: the last turn's analysis and
  final message ending in <|return|>; earlier turns' final message ending in <|end|> (their analysis is
  dropped by the template); a tool call's recipient, arguments and <|call|>.
* Gemma 3: each reply and its <end_of_turn>; its template has no tools (a tool turn is refused: MaskError).
"""

from __future__ import annotations

import copy

import pytest

from tests.train.test_data import make_cfg, only_example, write_jsonl
from train.dataset.chat import MaskError, has_generation_markers, tokenize_chat
from train.dataset.load import load_tokenizer
from tests.train.test_chat_templates import TEMPLATES, learned_spans

FAMILIES = {  # template, bos, eos, further special tokens of the family's tokenizer
    "qwen3": ("qwen3.jinja", None, "<|im_end|>", ("<|im_start|>", "<|endoftext|>", "<think>", "</think>",
                                                  "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")),
    "gpt-oss": ("gpt-oss.jinja", None, "<|return|>", ("<|start|>", "<|end|>", "<|message|>", "<|channel|>",
                                                      "<|call|>", "<|constrain|>", "<|endoftext|>")),
    "gemma3": ("gemma-3-it.jinja", "<bos>", "<eos>", ("<start_of_turn>", "<end_of_turn>")),
}


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory, tiny_tokenizer):
    loaded = {}
    for name, (template, bos, eos, specials) in FAMILIES.items():
        tokenizer = copy.deepcopy(tiny_tokenizer)
        tokenizer.add_tokens([t for t in (bos, eos, *specials) if t], special_tokens=True)
        tokenizer.bos_token, tokenizer.eos_token = bos, eos
        tokenizer.chat_template = (TEMPLATES / template).read_text(encoding="utf-8")
        directory = tmp_path_factory.mktemp(name)
        tokenizer.save_pretrained(directory)
        cfg = make_cfg(directory)
        cfg.model.tokenizer = str(directory)
        loaded[name] = load_tokenizer(cfg)
        assert not has_generation_markers(loaded[name])  # the turn-by-turn path
    return loaded


def learned(tokenizer, messages, tools=None) -> list[str]:
    ids, labels = tokenize_chat(tokenizer, messages, False, tools=tools)
    assert tokenizer.decode(ids) == tokenizer.apply_chat_template(messages, tools=tools, tokenize=False)
    return learned_spans(tokenizer, labels)


def two_turns(reasoning_key: str) -> list[dict]:
    return [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+3?"},
            {"role": "assistant", "content": "5.", reasoning_key: "two plus three"},
            {"role": "user", "content": "times 2?"},
            {"role": "assistant", "content": "10.", reasoning_key: "five times two"}]


TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City."}},
                   "required": ["city"]}}}]
TOOL_CHAT = [{"role": "user", "content": "Weather in Paris?"},
             {"role": "assistant", "content": "", "tool_calls": [
                 {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
             {"role": "tool", "content": "18C"},
             {"role": "assistant", "content": "It is 18C."}]


def test_qwen3_learns_the_last_turns_thinking_and_every_reply(tokenizers):
    tokenizer = tokenizers["qwen3"]
    assert learned(tokenizer, two_turns("reasoning_content")) == [
        "5.<|im_end|>", "<think>\nfive times two\n</think>\n\n10.<|im_end|>"]
    # The reasoning written inline in the content is the same to the template.
    inline = [{"role": m["role"], "content": f"<think>\n{m['reasoning_content']}\n</think>\n\n{m['content']}"}
              if "reasoning_content" in m else m for m in two_turns("reasoning_content")]
    assert learned(tokenizer, inline) == learned(tokenizer, two_turns("reasoning_content"))


def test_qwen3_without_reasoning_learns_the_empty_thinking_block(tokenizers):
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    assert learned(tokenizers["qwen3"], messages) == ["<think>\n\n</think>\n\nhello<|im_end|>"]


def test_qwen3_tool_call_and_answer(tokenizers):
    assert learned(tokenizers["qwen3"], TOOL_CHAT, TOOLS) == [
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>',
        "<think>\n\n</think>\n\nIt is 18C.<|im_end|>"]


def test_gpt_oss_learns_analysis_and_final_of_the_last_turn_and_earlier_finals(tokenizers):
    assert learned(tokenizers["gpt-oss"], two_turns("thinking")) == [
        "<|channel|>final<|message|>5.<|end|>",
        "<|channel|>analysis<|message|>five times two<|end|><|start|>assistant<|channel|>final<|message|>10.<|return|>"]


def test_gpt_oss_tool_call_learns_recipient_arguments_and_call(tokenizers):
    assert learned(tokenizers["gpt-oss"], TOOL_CHAT, TOOLS) == [
        ' to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Paris"}<|call|>',
        "<|channel|>final<|message|>It is 18C.<|return|>"]


def test_gemma3_learns_each_reply_and_end_of_turn_system_in_the_first_user_turn(tokenizers):
    tokenizer = tokenizers["gemma3"]
    messages = two_turns("unused")
    assert tokenizer.apply_chat_template(messages, tokenize=False) == (
        "<bos><start_of_turn>user\nBe brief.\n\n2+3?<end_of_turn>\n<start_of_turn>model\n5.<end_of_turn>\n"
        "<start_of_turn>user\ntimes 2?<end_of_turn>\n<start_of_turn>model\n10.<end_of_turn>\n")
    assert learned(tokenizer, messages) == ["5.<end_of_turn>", "10.<end_of_turn>"]


def test_gemma3_has_no_tool_turns(tokenizers):
    with pytest.raises(MaskError, match="roles must alternate"):
        tokenize_chat(tokenizers["gemma3"], TOOL_CHAT, False, tools=TOOLS)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_data_file_row_trains_the_same_tokens(tmp_path, tokenizers, family):
    """Through the data pipeline (a JSONL row, build_datasets) the learned tokens are the ones above."""
    key = "thinking" if family == "gpt-oss" else "reasoning_content"
    messages = two_turns(key)
    tokenizer = tokenizers[family]
    ids, labels = only_example(make_cfg(tmp_path, write_jsonl(tmp_path / "d.jsonl", [{"messages": messages}])),
                               tokenizer)
    assert learned_spans(tokenizer, labels) == learned(tokenizer, two_turns(key))
