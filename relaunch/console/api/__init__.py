"""`/api/v1`: the console's versioned JSON API for scripts and other tools (docs/api.md)."""
