"""I/O adapters: Slurm, liveness probes, logs and log stores, telemetry, notifications, bundles,
the audit store (and its retention, lease and pause rows), the Temporal connection, tracing."""
