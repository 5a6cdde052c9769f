"""The fault-injection benchmark behind `make bench` (entry point: bench/run.py)."""
