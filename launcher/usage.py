"""The argument parser every `sft-launch` command uses: a usage error is one line plus a pointer
to --help (exit 2 through cli.main), not argparse's whole usage block.

No abbreviations (`--max_step` is not `--max_steps`: a prefix that happens to match today may
match another flag tomorrow), and an unknown flag gets the closest real one as a hint, with `-`
and `_` treated alike (`--max-steps` -> `--max_steps`).
"""

from __future__ import annotations

import argparse
import difflib
import re
from typing import Any, NoReturn

from contract.schema import ConfigError

_UNRECOGNIZED = re.compile(r"^unrecognized arguments: (.*)$")


class UsageError(ConfigError):
    """A bad command line; cli.main prints it as one line and exits 2."""


def closest(word: str, choices: list[str]) -> str | None:
    """The choice most like `word` (dashes and underscores alike), or None when none is close."""
    canon = {choice.replace("-", "_").lower(): choice for choice in choices}
    match = difflib.get_close_matches(word.replace("-", "_").lower(), list(canon), n=1, cutoff=0.75)
    return canon[match[0]] if match else None


class Parser(argparse.ArgumentParser):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def _flags(self) -> list[str]:
        return [flag for action in self._actions for flag in action.option_strings if flag.startswith("--")]

    def error(self, message: str) -> NoReturn:
        unknown = _UNRECOGNIZED.match(message)
        if unknown:
            flags = [word.partition("=")[0] for word in unknown[1].split() if word.startswith("-")]
            for flag in flags:
                hint = closest(flag, self._flags())
                if hint:
                    raise UsageError(f"unknown flag {flag}; did you mean {hint}? (try '{self.prog} --help')")
            if flags:
                raise UsageError(f"unknown flag {flags[0]}; try '{self.prog} --help'")
        raise UsageError(f"{message}; try '{self.prog} --help'")


def given(value: str) -> str:
    """A flag's value that is not empty: `--data "$DATA"` with DATA unset must not mean the working directory
    (nor `--cluster ""` the default cluster file)."""
    if not value.strip():
        raise argparse.ArgumentTypeError("empty value (an unset shell variable?)")
    return value
