"""Thin Temporal activities over connectors and detection (the recovery-loop milestone)."""
