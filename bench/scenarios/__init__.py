"""The scenarios of ``python -m bench SCENARIO`` (bench/__main__.py dispatches each name
to its module here)."""
