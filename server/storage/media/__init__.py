"""What a run logged beyond numbers: histograms, images, tables, text (``rows``), and its ``run.summary`` (``summary``)."""
