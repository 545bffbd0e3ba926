"""Results, status and cancel."""
