"""Torch frontend tests: errors a user meets when a model cannot be captured."""
