"""The training loop's pace: the throughput rule, the cause of a slowdown, and the notes of slowdowns that are not the run's own."""
