"""Sandbox-safe orchestration: the RecoveryWorkflow (the recovery-loop milestone)."""
