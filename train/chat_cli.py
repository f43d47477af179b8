"""`python -m train.chat_cli --model DIR`: talk to an exported model through its own chat template.

Started by `sft-launch chat RUN` (launcher/commands/chat_cmd.py). `--prompt TEXT` answers once and exits;
without it, a conversation on stdin (a terminal or a pipe): `/reset` forgets it, `/exit` or EOF
ends it. Greedy by default; the sampling flags are transformers' `generate` arguments.
Exit 0 ok, 2 usage (bad flag, export without a chat template), 1 failure (contract.protocol's codes).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from contract.protocol import EXIT_OK, EXIT_USAGE, is_exported_model
from contract.schema import ConfigError, Parser

GENERATE_FLAGS = ("max_new_tokens", "do_sample", "temperature", "top_p", "top_k", "repetition_penalty", "num_beams")


def build_parser() -> argparse.ArgumentParser:
    """A bad flag is a UsageError (one line, exit 2), as every sft-launch command says it; no abbreviations."""
    parser = Parser(prog="sft-launch chat", description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="Hugging Face model directory (the run's export)")
    parser.add_argument("--prompt", help="one user message: print the reply and exit (default: interactive)")
    parser.add_argument("--system", help="system message at the start of the conversation")
    parser.add_argument("--max_new_tokens", type=int, default=256, help="reply length cap (default 256)")
    parser.add_argument("--do_sample", action="store_true", help="sample instead of greedy decoding")
    parser.add_argument("--temperature", type=float, help="sampling temperature (with --do_sample)")
    parser.add_argument("--top_p", type=float, help="nucleus sampling mass (with --do_sample)")
    parser.add_argument("--top_k", type=int, help="top-k sampling (with --do_sample)")
    parser.add_argument("--repetition_penalty", type=float, help="> 1 discourages repeats")
    parser.add_argument("--num_beams", type=int, help="beam search width (greedy: 1)")
    parser.add_argument("--seed", type=int, default=0, help="random seed for sampling (default 0)")
    return parser


# flag -> (the check, what it must be): generate() raises only once the model is loaded
LIMITS = {"max_new_tokens": (lambda v: v >= 1, ">= 1"), "num_beams": (lambda v: v >= 1, ">= 1"),
          "top_k": (lambda v: v >= 0, ">= 0"), "temperature": (lambda v: v > 0, "> 0"),
          "top_p": (lambda v: 0 < v <= 1, "in (0, 1]"), "repetition_penalty": (lambda v: v > 0, "> 0")}


def out_of_range(args: argparse.Namespace) -> str | None:
    """The first generation flag whose value generate() would refuse, as an error message; None if all are fine."""
    for name, (ok, rule) in LIMITS.items():
        value = getattr(args, name)
        if value is not None and not ok(value):
            return f"--{name} {value}: must be {rule}"
    return None


def generate_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """The flags given, as generate() keywords; greedy unless --do_sample."""
    kwargs = {name: getattr(args, name) for name in GENERATE_FLAGS if getattr(args, name) is not None}
    if not args.do_sample:  # the export's generation_config may say otherwise: greedy means greedy
        kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
    return kwargs


class Chat:
    """A conversation with the model: messages so far, a reply per user turn."""

    def __init__(self, model_dir: str, system: str | None, kwargs: dict[str, Any]):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        if not self.tokenizer.chat_template:
            raise ValueError(f"--model {model_dir}: the tokenizer has no chat template (chat_template.jinja)")
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype="auto").to(self.device).eval()
        self.system, self.kwargs = system, kwargs
        self.messages: list[dict[str, str]] = []
        self.reset()

    def reset(self) -> None:
        self.messages = [{"role": "system", "content": self.system}] if self.system else []

    def reply(self, text: str) -> str:
        import torch

        from train.dataset.load import pad_id

        self.messages.append({"role": "user", "content": text})
        inputs = self.tokenizer.apply_chat_template(self.messages, add_generation_prompt=True, return_dict=True,
                                                    return_tensors="pt").to(self.device)
        with torch.inference_mode():
            output = self.model.generate(**inputs, pad_token_id=pad_id(self.tokenizer), **self.kwargs)
        answer = self.tokenizer.decode(output[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True).strip()
        self.messages.append({"role": "assistant", "content": answer})
        return answer


def interactive(chat: Chat) -> None:
    tty = sys.stdin.isatty()
    if tty:
        print("chat with the model: /reset forgets the conversation, /exit (or Ctrl-D) ends it", flush=True)
    while True:
        if tty:
            print("user> ", end="", flush=True)
        line = sys.stdin.readline()
        if not line or line.strip() == "/exit":
            return
        if line.strip() == "/reset":
            chat.reset()
            continue
        if line.strip():
            print(f"assistant> {chat.reply(line.strip())}", flush=True)


def _error(message: object) -> int:
    print(f"sft-launch chat: error: {message}", file=sys.stderr)
    return EXIT_USAGE


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        if problem := out_of_range(args):
            parser.error(problem)
    except ConfigError as err:
        return _error(err)
    if not is_exported_model(Path(args.model)):
        return _error(f"--model {args.model}: no config.json or adapter_config.json (not an exported model)")
    import torch

    torch.manual_seed(args.seed)
    try:
        chat = Chat(args.model, args.system, generate_kwargs(args))
    except ValueError as err:
        return _error(err)
    if args.prompt is not None:
        print(chat.reply(args.prompt), flush=True)
        return EXIT_OK
    try:
        interactive(chat)
    except KeyboardInterrupt:
        print()
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
