"""The torch-free contract between the launcher (login node) and train (compute nodes).

`launcher` and `train` both import `contract`; `contract` imports neither, and never torch
(tests/test_architecture.py enforces all three). What lives here is every rule both sides must
agree on, written once: the configuration dataclasses and their validation (`schema`, `config`),
the command-line parser of every entry point, one-line usage errors (`schema.Parser`),
GPU facts (`gpus`), model shape and FLOPs (`shape`), the strategies table (`strategies`), the
run-directory layout, exit codes and stop/cancel protocol (`protocol`), the training command line
(`command`), the failure record a failed rank leaves (`failure`), and the parsing and checking of
dataset rows (`formats`, `datacheck`: the training side and the login-node check share them).
"""

__version__ = "0.1.0"  # of sft-launch (pyproject.toml); rendered into every run directory
