"""Producing jobs: the App and its tasks, options, codec, keys, enqueue scripts, refused
values."""
