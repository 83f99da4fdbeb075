"""Notifications that arrive: per-project webhooks (Slack, Discord, JSON) and email, routed by severity, retried, recorded."""
