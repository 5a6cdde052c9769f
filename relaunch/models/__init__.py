"""Pydantic contracts shared by every layer. Imports pydantic only."""
