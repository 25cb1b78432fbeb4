"""Typical wrong answers of the exercises, one data module per notebook (see tests/support/exercise_registry.py)."""
