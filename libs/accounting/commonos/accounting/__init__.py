"""Token usage and pricing, shared by the loop, billing and the importer (no I/O)."""
