"""Adapters that drive gradwatch and the tools users would pick instead through one interface.

Each module defines ``Tool`` (a subclass of ``base.Tool``); ``worker.py`` runs the measurements
inside the tool's own virtualenv, so a peer is never imported into gradwatch's environment.
"""
