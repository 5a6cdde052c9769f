"""Pydantic contracts shared by every layer, typed errors, name validation and the
search-attribute names. Imports pydantic and the standard library only."""
