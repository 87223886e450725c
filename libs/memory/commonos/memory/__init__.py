"""The Memory plugin's schema and rows, shared by the loop and its projection (no I/O)."""
