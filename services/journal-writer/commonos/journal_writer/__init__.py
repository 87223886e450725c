"""The journal-writer: projects the event stream into the core PostgreSQL tables."""
