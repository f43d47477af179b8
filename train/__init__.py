"""sft-launch training side (runs on compute nodes). Keep this import light; train imports contract, never launcher."""
