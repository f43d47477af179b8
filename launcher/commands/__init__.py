"""commands: the `sft-launch` subcommands that drive the stages (launch, plan, eval, chat, models).
May import any launcher module; only launcher/cli.py names them (launcher/ops/: after submission)."""
