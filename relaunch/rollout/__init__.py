"""Earning autonomy: the scorecard and staged rollout (docs/autonomy.md)."""
