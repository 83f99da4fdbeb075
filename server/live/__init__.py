"""What leaves the server as it happens: pushes to open pages, to other server processes, and to webhooks."""
