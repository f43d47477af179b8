"""contract.schema.Parser, the one command-line rule of the launcher's commands and train's chat: a usage
error is one line (UsageError, exit 2) pointing to --help, flags are never abbreviated, a near miss gets a hint."""

from __future__ import annotations

import pytest

from contract.protocol import EXIT_USAGE
from contract.schema import ConfigError, Parser, UsageError


def _parser() -> Parser:
    parser = Parser(prog="tool")
    parser.add_argument("--max_steps", type=int)
    parser.add_argument("--dry-run", action="store_true")
    return parser


@pytest.mark.parametrize(("argv", "message"), [
    (["--max_step", "3"], "unknown flag --max_step; did you mean --max_steps? (try 'tool --help')"),  # no prefix
    (["--max-steps=3"], "unknown flag --max-steps; did you mean --max_steps? (try 'tool --help')"),
    (["--dry_run"], "unknown flag --dry_run; did you mean --dry-run? (try 'tool --help')"),
    (["--turbo"], "unknown flag --turbo; try 'tool --help'"),
    (["extra"], "unrecognized arguments: extra; try 'tool --help'"),
    (["--max_steps", "x"], "argument --max_steps: invalid int value: 'x'; try 'tool --help'"),
])
def test_a_usage_error_is_one_line_with_a_hint(argv: list[str], message: str) -> None:
    with pytest.raises(UsageError) as raised:
        _parser().parse_args(argv)
    assert str(raised.value) == message
    assert isinstance(raised.value, ConfigError)  # what every entry point turns into exit 2


def test_the_launcher_and_train_use_the_one_parser() -> None:
    from launcher import usage
    from train import chat_cli

    assert usage.Parser is Parser and usage.UsageError is UsageError
    assert isinstance(chat_cli.build_parser(), Parser)


@pytest.mark.parametrize(("argv", "message"), [
    (["--max_new_token", "5"], "unknown flag --max_new_token; did you mean --max_new_tokens?"),
    (["--top_k", "many"], "argument --top_k: invalid int value: 'many'"),
    (["--num_beams", "0"], "--num_beams 0: must be >= 1"),
])
def test_chat_refuses_a_bad_flag_in_one_line_before_loading_anything(
        argv: list[str], message: str, tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    from train import chat_cli

    assert chat_cli.main(["--model", str(tmp_path), *argv]) == EXIT_USAGE
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("sft-launch chat: error: ") and message in line, line
    assert "try 'sft-launch chat --help'" in line
