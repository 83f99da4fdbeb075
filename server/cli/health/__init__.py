"""The commands that show a run's health in a terminal: ``gradwatch incidents`` and ``gradwatch tail``."""
