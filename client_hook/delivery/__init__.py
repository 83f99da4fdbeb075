"""Getting records to the server: batching, the websocket link, the outbox that spills to a spool on disk, gaps."""
