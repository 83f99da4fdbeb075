"""Storage: schema and migrations, chunks and rollups, and the read side (runs, series, heatmaps)."""
