"""Outgoing notifications: a generic JSON webhook, Slack, and PagerDuty's Events API v2."""
