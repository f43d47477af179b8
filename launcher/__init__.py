"""sft-launch: the login-node side. Never imports torch."""

__version__ = "0.1.0"
