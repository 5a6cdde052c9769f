"""The web console (a later milestone)."""
