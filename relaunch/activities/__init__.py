"""Temporal activities: thin steps over the connectors and the detection code, one per step of a
recovery."""
