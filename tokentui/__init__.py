"""tokentui: watch a language model write, one token at a time."""

__version__ = "0.1.0"
