"""Importable batchq apps for tests that run real worker processes."""
