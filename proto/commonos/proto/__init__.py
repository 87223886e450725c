"""Event contracts of CommonOS: wire shapes, identity, tags and subjects. No I/O lives here."""
