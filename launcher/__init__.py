"""sft-launch, the login-node side: cli.py, api.py (`launcher.submit`/`attach`, loaded lazily), usage.py, runrecord.py,
and the stages resolve/ -> plan/, execute/, driven by commands/ and ops/. Imports contract, never torch or train."""

from typing import Any

from contract import __version__  # noqa: F401  (launcher.__version__)


def __getattr__(name: str) -> Any:
    if name in ("submit", "attach"):
        from launcher import api

        return getattr(api, name)
    raise AttributeError(f"module 'launcher' has no attribute {name!r}")
