"""Process entrypoints: the `relaunch` CLI (and, in later issues, the worker, watcher, agent)."""
