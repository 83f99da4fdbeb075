"""gradwatch server: ingest over websockets, store with SQLAlchemy, serve the dashboard."""
