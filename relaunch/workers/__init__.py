"""The long-running processes: the Temporal worker, the watcher and the node agent."""
