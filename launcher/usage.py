"""The argument parser every `sft-launch` command uses: a usage error is one line plus a pointer
to --help (exit 2 through cli.main), not argparse's whole usage block."""

from __future__ import annotations

import argparse
from typing import NoReturn

from contract.schema import ConfigError


class UsageError(ConfigError):
    """A bad command line; cli.main prints it as one line and exits 2."""


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message}; try '{self.prog} --help'")
