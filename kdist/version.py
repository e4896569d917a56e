"""kdist's version, in a module of its own so that anything can read it without importing the package root."""

__version__ = "0.2.0"
