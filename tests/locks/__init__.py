"""app.lock and its scripts."""
