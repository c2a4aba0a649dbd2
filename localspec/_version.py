"""localspec's version, on the ground floor: what imports it (the hub's user agent, `--version`) needs nothing
else of the package, and it holds where localspec runs from a checkout on PYTHONPATH, without package metadata.
pyproject.toml reads it from here."""

__version__ = "0.1.0"
