"""contract/rendercheck.py: the rule both the plan and the training apply to a rendered conversation."""

from contract.rendercheck import unrendered_part

ASKED = [{"role": "user", "content": "2+3?"}, {"role": "assistant", "content": "<think>\ntwo plus three\n</think>\n\n5."},
         {"role": "user", "content": "and 4+4?"}, {"role": "assistant", "content": "<think>\nfour and four\n</think>\n\n8."}]


def test_an_earlier_turns_reasoning_is_the_templates_to_drop_but_not_its_answer():
    """Qwen3's template renders reasoning only after the last user query: an earlier turn shown without its
    <think> block is the model's own format; a reply left out is a trimmed row."""
    as_qwen3_renders = "<|im_start|>user\n2+3?<|im_end|>\n<|im_start|>assistant\n5.<|im_end|>\n<|im_start|>user\n" \
                       "and 4+4?<|im_end|>\n<|im_start|>assistant\n<think>\nfour and four\n</think>\n\n8.<|im_end|>\n"
    assert unrendered_part(as_qwen3_renders, ASKED) is None
    assert unrendered_part(as_qwen3_renders.replace("5.", ""), ASKED) == "messages[1]: assistant text '5.'"
    assert unrendered_part("2+3? and 4+4? 8.", ASKED) == "messages[1]: assistant text '5.'"
