"""Temporal activities: thin steps over the connectors and the detection code, each one step of
a recovery, a node decision or a node lifecycle (the workflows in relaunch/workflows/)."""
