"""Alembic revisions, 0001, 0002, ... (a package so that setuptools installs them with the code)."""
