"""`sft-launch models`: list the model presets."""

from __future__ import annotations

from launcher.resolve.presets import format_presets
from launcher.usage import Parser


def main(argv: list[str]) -> int:
    parser = Parser(prog="sft-launch models", description="List the model presets "
                                     "(--model also takes a local model directory or a cached HF id).")
    parser.parse_args(argv)
    print(format_presets())
    return 0
