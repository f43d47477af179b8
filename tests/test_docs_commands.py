"""Every `sft-launch` line in the docs' shell blocks parses with the real CLI (issue #56: no command in the docs
that does not run). Each line goes through launcher.cli.main in this process with the commands' own parsers;
the parse is stopped right after the flags are read, so nothing is planned, rendered or submitted."""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest

from contract.schema import Parser, UsageError
from launcher import cli

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", ROOT / "BENCHMARKS.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(?:bash|sh|shell|console)[ \t]*\n(.*?)^```", re.S | re.M)
OPERATORS = {"&&", "||", ";", "|", "&", "(", ")"}
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


def shell_lines(markdown: str) -> list[str]:
    """The command lines of a page's shell blocks: `\\` continuations joined, a console's `$ ` prompt dropped."""
    lines = []
    for block in FENCE.findall(markdown):
        for line in re.sub(r"\\\n", " ", block).splitlines():
            lines.append(line.strip().removeprefix("$ "))
    return lines


def sft_launch_argvs(line: str) -> list[list[str]]:
    """The argv of every `sft-launch` command on a shell line (after `&&`, `;`, `|`, env assignments), comments
    dropped."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    commands, words = [], []
    for token in [*lexer, ";"]:
        if token in OPERATORS:
            commands.append(words)
            words = []
        else:
            words.append(token)
    argvs = []
    for words in commands:
        while words and ASSIGNMENT.match(words[0]):
            words = words[1:]
        if words and words[0] == "sft-launch":
            argvs.append(words[1:])
    return argvs


class _Parsed(Exception):
    """Raised by the patched parser once a command's flags are read: the command stops there."""

    def __init__(self, parser: argparse.ArgumentParser, rest: list[str]) -> None:
        self.parser, self.rest = parser, rest


@pytest.fixture
def parse_only(monkeypatch: pytest.MonkeyPatch):
    """A function: argv -> None when the real CLI accepts its flags, else the CLI's one-line error."""
    real = Parser.parse_known_args

    def stop_after_parsing(self, args=None, namespace=None):
        _, rest = real(self, args, namespace)
        raise _Parsed(self, rest)

    monkeypatch.setattr(Parser, "parse_known_args", stop_after_parsing)

    def check(argv: list[str]) -> str | None:
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            try:
                cli.main(argv)
            except _Parsed as parsed:
                return _leftovers(argv, parsed)
            except SystemExit as exit_:  # --help
                return None if exit_.code == 0 else f"exit {exit_.code}"
        return err.getvalue().strip() or "the CLI returned without parsing"

    return check


def _leftovers(argv: list[str], parsed: _Parsed) -> str | None:
    """parse_args' refusal of the words left over, with the parser's hint; `chat` hands them to the chat's own
    parser (train/chat_cli.py) first."""
    if parsed.rest and argv[0] == "chat" and parsed.parser.prog == "sft-launch chat":
        from train.chat_cli import build_parser

        try:
            build_parser().parse_args(["--model", "EXPORT", *parsed.rest])
        except _Parsed as chat:
            parsed = chat
    if not parsed.rest:
        return None
    try:
        parsed.parser.error(f"unrecognized arguments: {' '.join(parsed.rest)}")  # what parse_args does with them
    except UsageError as err:
        return str(err)


def _documented() -> list[tuple[str, list[str]]]:
    return [(f"{page.name}: {line}", argv) for page in DOCS for line in shell_lines(page.read_text())
            for argv in sft_launch_argvs(line)]


def test_every_documented_sft_launch_line_parses(parse_only) -> None:
    documented = _documented()
    assert len(documented) >= 20, "the docs' shell blocks were not found"
    refused = {where: problem for where, argv in documented if (problem := parse_only(argv))}
    assert not refused, "\n".join(f"{where}\n    -> {problem}" for where, problem in refused.items())


def test_a_made_up_flag_or_command_is_caught(parse_only) -> None:
    block = ("```bash\nbash scripts/setup.sh && sft-launch --executor local --model tiny --turbo  # made up\n"
             "sft-launch stauts RUN\nsft-launch plan --model tiny \\\n  --strategy fsdp3\n"
             "sft-launch logs RUN -f\n```\n")
    lines = shell_lines(block)
    argvs = [argv for line in lines for argv in sft_launch_argvs(line)]
    assert argvs == [["--executor", "local", "--model", "tiny", "--turbo"], ["stauts", "RUN"], ["plan", "--model", "tiny", "--strategy", "fsdp3"],
                     ["logs", "RUN", "-f"]]
    problems = [parse_only(argv) for argv in argvs]
    assert "unknown flag --turbo" in problems[0]
    assert "unknown command 'stauts'" in problems[1]
    assert "argument --strategy: invalid choice: 'fsdp3'" in problems[2]
    assert problems[3] is None


def test_chat_generation_flags_are_checked_by_the_chat_parser(parse_only) -> None:
    assert parse_only(["chat", "RUN", "--max_new_tokens", "64", "--do_sample"]) is None
    assert "--max_new_token" in parse_only(["chat", "RUN", "--max_new_token", "64"])


def test_every_documented_data_source_is_valid(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The `[[data.sources]]` examples of the docs use real keys, formats and column names (contract/sources.py);
    a `tools` file they name is read, so an empty one stands in for it."""
    import tomllib

    from contract.sources import DataSource

    tables = [table for page in DOCS for block in re.findall(r"^```toml\n(.*?)^```", page.read_text(), re.S | re.M)
              for table in tomllib.loads(block).get("data", {}).get("sources", [])]
    assert len(tables) >= 9
    monkeypatch.chdir(tmp_path)
    for table in tables:
        if table.get("tools"):
            (tmp_path / table["tools"]).write_text("[]")
        DataSource(**table).validate()


def _anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(page: Path) -> list[str]:
    """The anchors of a page's headings, those inside code blocks left out."""
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)
    return [_anchor(heading) for heading in re.findall(r"^#+ (.+)$", text, re.M)]


def test_every_relative_link_of_the_docs_resolves() -> None:
    """README's "one link away" holds: each relative link names an existing file and, with #, one of its headings."""
    broken = []
    for page in DOCS:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            if not file.exists() or (anchor and anchor not in _anchors(file)):
                broken.append(f"{page.name}: {target}")
    assert not broken, broken
