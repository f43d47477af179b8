"""sft-launch: the login-node side. Never imports torch.

`launcher.submit(...)` / `launcher.attach(run_dir)` are the Python API (launcher/api.py), loaded
lazily so that `import launcher` stays instant.
"""

from typing import Any

from contract import __version__  # noqa: F401  (launcher.__version__)


def __getattr__(name: str) -> Any:
    if name in ("submit", "attach"):
        from launcher import api

        return getattr(api, name)
    raise AttributeError(f"module 'launcher' has no attribute {name!r}")
