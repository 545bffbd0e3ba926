"""One-off measurements, each run as ``python -m bench.tools.NAME`` (see
bench/README.md)."""
