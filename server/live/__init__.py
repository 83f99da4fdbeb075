"""What leaves the server as it happens: pushes to open pages and to other server processes (webhooks: notify/)."""
