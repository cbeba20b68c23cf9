"""The version of corrtree (one place: the package and its build metadata read it)."""

__version__ = "0.6.0"
