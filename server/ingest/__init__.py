"""The ingest path: a batch off the wire, its sequence claim, its rows written on the one writer thread, run states."""
