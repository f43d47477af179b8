"""Helpers every bench area shares: child processes under a time limit, the synthetic documents, the arithmetic corpus.
Imports no other bench area (contract, launcher and train only)."""
