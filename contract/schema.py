"""Self-validating config dataclasses: dict (from TOML / --set) -> dataclass, with errors that name the key.

Every config section in the project (cluster profile, train.toml) is a plain dataclass. `build`
turns a nested dict into one, rejecting unknown keys (listing the valid ones) and wrong types,
then calls the dataclass's own `validate()` if it has one. No torch here: the CLI must stay instant.

`Parser` is the command-line side of the same rule, the argparse parser of every entry point (each
`sft-launch` command, `python -m train.chat_cli`): a usage error is a one-line `UsageError` plus a
pointer to --help (exit 2, `protocol.EXIT_USAGE`), not argparse's whole usage block. No abbreviations
(`--max_step` is not `--max_steps`: a prefix that happens to match today may match another flag
tomorrow), and an unknown flag gets the closest real one as a hint, with `-` and `_` treated alike
(`--max-steps` -> `--max_steps`).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import difflib
import re
import tomllib
import types
import typing
from pathlib import Path
from typing import Any, NoReturn, TypeVar

T = TypeVar("T")
_UNRECOGNIZED = re.compile(r"^unrecognized arguments: (.*)$")


class ConfigError(ValueError):
    """A usage/config error: one line naming the key. The CLI turns it into exit code 2."""

    def __init__(self, message: str, key: str | None = None):
        super().__init__(message)
        self.key = key


def closest(name: str, choices: typing.Iterable[str]) -> str:
    """' (did you mean: a, b?)' or '' — for error messages."""
    matches = difflib.get_close_matches(name, list(choices), n=3, cutoff=0.5)
    return f" (did you mean: {', '.join(matches)}?)" if matches else ""


class UsageError(ConfigError):
    """A bad command line: the entry point prints it as one line and exits 2 (protocol.EXIT_USAGE)."""


def _closest_flag(word: str, flags: list[str]) -> str | None:
    """The flag most like `word` (dashes and underscores alike), or None when none is close."""
    canon = {flag.replace("-", "_").lower(): flag for flag in flags}
    match = difflib.get_close_matches(word.replace("-", "_").lower(), list(canon), n=1, cutoff=0.75)
    return canon[match[0]] if match else None


class Parser(argparse.ArgumentParser):
    """argparse without abbreviations whose usage errors raise UsageError (see the module's docstring)."""

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
                hint = _closest_flag(flag, self._flags())
                if hint:
                    raise UsageError(f"unknown flag {flag}; did you mean {hint}? (try '{self.prog} --help')")
            if flags:
                raise UsageError(f"unknown flag {flags[0]}; try '{self.prog} --help'")
        raise UsageError(f"{message}; try '{self.prog} --help'")


def _type_name(tp: Any) -> str:
    if typing.get_origin(tp) is typing.Literal:
        return " or ".join(repr(value) for value in typing.get_args(tp))
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Check `value` against annotation `tp`; allow int -> float. Returns the (possibly converted) value."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        if len(args) == 2 and type(None) in args:  # Optional[X]: X's own error names the nested key
            return _coerce(value, next(a for a in args if a is not type(None)), key)
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, key)
            except ConfigError:
                continue
        raise ConfigError(f"{key}: expected {' or '.join(_type_name(a) for a in args)}, got {value!r}", key)
    if origin is typing.Literal:
        allowed = typing.get_args(tp)
        if value not in allowed:
            raise ConfigError(f"{key}: must be one of {', '.join(map(repr, allowed))}, got {value!r}", key)
        return value
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: expected a list, got {value!r}", key)
        (item_tp, *_) = typing.get_args(tp) or (Any,)
        return [_coerce(v, item_tp, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a table, got {value!r}", key)
        _, val_tp = typing.get_args(tp) or (str, Any)
        return {str(k): _coerce(v, val_tp, f"{key}.{k}") for k, v in value.items()}
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a table, got {value!r}", key)
        return build(tp, value, prefix=key)
    if tp is Any:
        return value
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp is bool and not isinstance(value, bool):
        raise ConfigError(f"{key}: expected true or false, got {value!r}", key)
    if tp is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise ConfigError(f"{key}: expected an integer, got {value!r}", key)
    if isinstance(tp, type) and not isinstance(value, tp):
        raise ConfigError(f"{key}: expected {_type_name(tp)}, got {value!r}", key)
    return value


def build(cls: type[T], data: dict[str, Any], prefix: str = "") -> T:
    """Build dataclass `cls` from `data`; unknown keys and wrong types raise ConfigError naming the dotted key."""
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    kwargs = {}
    for name, value in data.items():
        key = f"{prefix}.{name}" if prefix else name
        if name not in fields:
            raise ConfigError(
                f"unknown key '{key}'{closest(name, fields)}; valid keys: {', '.join(sorted(fields))}", key
            )
        kwargs[name] = _coerce(value, hints[name], key)
    obj = cls(**kwargs)
    validate = getattr(obj, "validate", None)
    if validate is not None:
        try:
            validate()
        except ConfigError as err:
            if prefix and err.key and not err.key.startswith(prefix):
                raise ConfigError(f"{prefix}.{err}", f"{prefix}.{err.key}") from None
            raise
    return obj


def documented(default: Any, text: str) -> Any:
    """A dataclass field with a one-line description (`field_help`), e.g. shown by `sft-launch --help`."""
    if isinstance(default, (list, dict)):
        return dataclasses.field(default_factory=lambda: copy.deepcopy(default), metadata={"help": text})
    return dataclasses.field(default=default, metadata={"help": text})


def field_help(cls: type, name: str) -> str:
    """The description `documented` gave field `name` of dataclass `cls` ('' when none)."""
    return next((f.metadata.get("help", "") for f in dataclasses.fields(cls) if f.name == name), "")


def to_dict(obj: Any) -> dict[str, Any]:
    """Dataclass -> plain dict with None values dropped (TOML has no null)."""

    def clean(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: clean(v) for k, v in value.items() if v is not None}
        if isinstance(value, (list, tuple)):
            return [clean(v) for v in value]
        return value

    return clean(dataclasses.asdict(obj))


def parse_value(text: str) -> Any:
    """A --set / training-flag value: a TOML literal (1e-5, true, ["a"]) or else the plain string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def field_type(cls: type, dotted: str) -> Any:
    """The annotation of dotted key `dotted` of dataclass `cls` (through tables and dicts); None if unknown."""
    tp: Any = cls
    for part in dotted.split("."):
        if dataclasses.is_dataclass(tp):
            tp = typing.get_type_hints(tp).get(part)
        elif typing.get_origin(tp) is dict:
            tp = (typing.get_args(tp) or (str, Any))[1]
        else:
            return None
    return tp


def parse_for(text: str, tp: Any) -> Any:
    """parse_value, except that a number typed where only a text fits stays the text typed: sbatch takes
    `--set profile.account=12345` or `profile.mem=64000` literally, and "expected str, got 12345" helps nobody."""
    value = parse_value(text)
    union = typing.get_origin(tp) in (typing.Union, types.UnionType)
    kinds = set(typing.get_args(tp)) if union else {tp}
    if isinstance(value, (int, float)) and not isinstance(value, bool) and str in kinds and not {int, float} & kinds:
        return text.strip()
    return value


def set_dotted(data: dict[str, Any], dotted: str, value: Any) -> None:
    """data['a']['b']['c'] = value for 'a.b.c', creating tables as needed."""
    *parents, leaf = dotted.split(".")
    node = data
    for part in parents:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"--set {dotted}: '{part}' is a value, not a table", dotted)
        node = child
    node[leaf] = value


def read_utf8(path: Path) -> str:
    """A config file's text; bytes that are not UTF-8 (TOML's encoding) are a ConfigError naming the file and
    line, not a UnicodeDecodeError traceback. OSError propagates."""
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise ConfigError(f"{path}:{line}: not valid UTF-8 (byte {err.start}); save the file as UTF-8") from None


def require(condition: bool, key: str, message: str) -> None:
    """Raise ConfigError('key: message') unless condition holds. Used by validate() methods."""
    if not condition:
        raise ConfigError(f"{key}: {message}", key)
