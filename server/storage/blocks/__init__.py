"""Blocks on disk: the compressed, checksummed form of chunks and rollups, rewriting old ones, what they cost."""
