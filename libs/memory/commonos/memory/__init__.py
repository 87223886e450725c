"""The Memory plugin's table and its rows from `memory_changed` events, for the journal-writer's projection (no I/O)."""
