"""Frontends: framework models -> Cuvil IR."""
