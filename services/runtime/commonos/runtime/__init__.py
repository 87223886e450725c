"""Runtime shared by every service: settings, connections, schema, health and metrics, lifecycle."""
