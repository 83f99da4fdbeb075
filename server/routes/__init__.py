"""HTTP and websocket routes, one module per concern; each parses and delegates."""
