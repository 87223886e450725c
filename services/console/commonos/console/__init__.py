"""The web console: sessions, live turns, chat, approvals and cost by tag, in a browser and as a JSON API.

It reads the projections in PostgreSQL (as the signed-in person's database role, so that row-level security
decides what an analyst sees), follows live events on NATS, and writes only by publishing requests the loop
already understands.
"""
