"""The library's version, recorded in every bundle and run (the package's face re-exports it)."""

__version__ = "0.1.0"
