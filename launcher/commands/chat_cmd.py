"""`sft-launch chat RUN [--prompt TEXT]`: talk to a run's exported model, here (train/chat_cli.py).

The launcher only finds the export and starts `python -m train.chat_cli` with this terminal; every
other flag (--prompt, --system, --max_new_tokens, --do_sample, --temperature, --top_p, --top_k,
--repetition_penalty, --num_beams, --seed) goes to it unchanged and is checked there (exit 2).
"""

from __future__ import annotations

import argparse
import subprocess
import sys

from launcher.ops import rundir
from launcher.usage import Parser

CHAT_MODULE = "train.chat_cli"
EPILOG = """\
generation flags (passed on; names as in transformers' generate):
  --prompt TEXT          one message, print the reply, exit (default: interactive, /reset, /exit)
  --system TEXT          system message
  --max_new_tokens N     reply length cap (default 256)
  --do_sample            sample instead of greedy decoding, with --temperature T --top_p P --top_k K
  --repetition_penalty R, --num_beams B, --seed S
"""


def main(argv: list[str]) -> int:
    parser = Parser(
        prog="sft-launch chat", description="Talk to a run's exported model through its chat template.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    rundir.add_run_arguments(parser)
    args, generation_flags = parser.parse_known_args(argv)
    model_dir = rundir.export_dir(rundir.resolve_run(args))  # ConfigError (exit 2) when there is none
    return subprocess.call([sys.executable, "-m", CHAT_MODULE, "--model", str(model_dir), *generation_flags])
