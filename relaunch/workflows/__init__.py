"""Sandbox-safe orchestration: the RecoveryWorkflow, one durable workflow per job attempt."""
