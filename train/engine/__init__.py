"""engine: the training loop and its state: model, sharding, optimizer, checkpoints, stop, watchdog, export.
May import contract, train.dataset, train.kernels, train.observe and train.persist; never train/'s entry modules."""
