"""Tests of the Lua scripts (importable as ``scripts``; shared helpers in ``._lua``)."""
