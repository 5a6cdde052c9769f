"""Process entrypoints: the `relaunch` CLI, the Temporal worker, the watcher and the node agent."""
