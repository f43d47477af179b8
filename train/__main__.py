"""``python -m train --config RUN_DIR/train.toml`` (run by ``accelerate launch``)."""

import sys

from train.main import main

sys.exit(main())
