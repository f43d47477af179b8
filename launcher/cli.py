"""`sft-launch` entry point: dispatch to a subcommand module, else launch a run.

Subcommands are modules with `main(argv: list[str]) -> int`, registered by dotted name in
COMMANDS and imported only when used (the CLI must start instantly; no torch on this path).
Exit codes: 0 ok, 1 runtime failure (e.g. sbatch refused), 2 usage/config error.
"""

from __future__ import annotations

import importlib
import logging
import sys

# name -> module with main(argv). To add a subcommand: a module with main(argv) (its parser a
# launcher.usage.Parser) and one line here; `sft-launch --help` lists the names.
COMMANDS: dict[str, str] = {
    "models": "launcher.commands.models_cmd",
    "status": "launcher.ops.status",
    "runs": "launcher.ops.runs",
    "logs": "launcher.ops.logs",
    "cancel": "launcher.ops.cancel",
    "plot": "launcher.ops.plot",
    "plan": "launcher.commands.plan_cmd",
    "eval": "launcher.commands.eval_cmd",
    "chat": "launcher.commands.chat_cmd",
}
LAUNCH_MODULE = "launcher.commands.launch"


def _error(message: str, code: int) -> int:
    print(f"sft-launch: error: {message}", file=sys.stderr)
    return code


def unknown_command(word: str) -> str | None:
    """The error for a first argument that is neither a subcommand nor a flag (the launch takes no
    positional arguments), with the closest subcommand when one is close; None for a flag."""
    if word.startswith("-"):
        return None
    from contract.schema import closest

    known = closest(word, COMMANDS) or f"; commands: {', '.join(COMMANDS)}"
    return f"unknown command '{word}'{known} (a launch takes only flags: try 'sft-launch --help')"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    logging.basicConfig(level=logging.INFO, format="sft-launch: %(message)s")
    if args and args[0] not in COMMANDS and (problem := unknown_command(args[0])):
        from contract.protocol import EXIT_USAGE

        return _error(problem, EXIT_USAGE)
    module_name = COMMANDS.get(args[0], LAUNCH_MODULE) if args else LAUNCH_MODULE
    command_args = args[1:] if args and args[0] in COMMANDS else args
    from contract.protocol import EXIT_FAILURE, EXIT_OK, EXIT_USAGE
    from contract.schema import ConfigError  # also schema.UsageError (bad flags)

    try:
        return int(importlib.import_module(module_name).main(command_args) or EXIT_OK)
    except ConfigError as err:
        return _error(str(err).splitlines()[0] if str(err) else "bad configuration", EXIT_USAGE)
    except RuntimeError as err:  # e.g. sbatch.SubmitError
        return _error(str(err), EXIT_FAILURE)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `sft-launch models | head`
        sys.stderr.close()
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
