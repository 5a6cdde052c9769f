"""The local development stack: Temporal dev server, PostgreSQL, munge and an N-node Slurm.

Used by ``relaunch dev up|down|status``, by ``make demo`` and by the test session fixtures.
"""
