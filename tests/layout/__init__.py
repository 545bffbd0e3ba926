"""Static rules of the source: package layout, Lua script headers."""
