"""`sft-launch models`: list the model presets."""

from __future__ import annotations

import argparse

from launcher.presets import format_presets


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="sft-launch models", description="List the model presets "
                                     "(--model also takes a local model directory or a cached HF id).")
    parser.parse_args(argv)
    print(format_presets())
    return 0
