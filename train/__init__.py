"""sft-launch training side (runs on compute nodes). Keep this import light: launcher imports train.config."""
