"""Integrations with other libraries (each optional)."""
