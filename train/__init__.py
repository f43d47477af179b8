"""sft-launch training side (compute nodes): the `python -m train[.X]` entry points (main, evaluate, export_checkpoint,
chat_cli) over engine/, dataset/, kernels/, observe/. Imports contract, never launcher; keep this import light."""
