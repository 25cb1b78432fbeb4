"""Typical wrong answers of the exercises, one data module per notebook (see tests/exercise_registry.py)."""
