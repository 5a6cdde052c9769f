"""I/O adapters: schedulers, logs, telemetry, notifications, the audit store."""
