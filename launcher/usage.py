"""The argument parser every `sft-launch` command uses, and the check of a flag's value they share.

`Parser` and `UsageError` are contract.schema's (written once there, for train's entry points too):
a usage error is one line plus a pointer to --help (exit 2 through cli.main), no abbreviations, and
an unknown flag gets the closest real one as a hint.
"""

from __future__ import annotations

import argparse

from contract.schema import Parser, UsageError

__all__ = ["Parser", "UsageError", "given"]


def given(value: str) -> str:
    """A flag's value that is not empty: `--data "$DATA"` with DATA unset must not mean the working directory
    (nor `--cluster ""` the default cluster file)."""
    if not value.strip():
        raise argparse.ArgumentTypeError("empty value (an unset shell variable?)")
    return value
