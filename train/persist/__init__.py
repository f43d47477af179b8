"""persist: checkpoint I/O that runs beside training: a snapshot staged to (pinned) CPU memory, written by a thread.
May import contract only; never another train folder (train.engine.checkpoint decides what a checkpoint is)."""
