"""Fault-injection tests: at-least-once delivery under crashes, outages and limits."""
