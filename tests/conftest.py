"""Session-wide settings for every test.

train/main.py keeps torch.compile's caches in the run directory (RUN/.compile-cache) unless
TORCHINDUCTOR_CACHE_DIR is set, so a requeued job finds its compiled graphs. Tests make a fresh run
directory each, so every compiled test would compile cold: the suite shares Inductor's own default
cache instead (the same graphs of the same tiny model), as it did before run directories kept their own.
"""

from __future__ import annotations

import getpass
import os
import tempfile

os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(tempfile.gettempdir(), f"torchinductor_{getpass.getuser()}"))
