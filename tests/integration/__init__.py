"""Integration tests: real worker processes against a real Redis/Valkey."""
