"""`cos`, the umbrella command line."""
