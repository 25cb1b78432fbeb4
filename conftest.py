"""Test-session settings shared by the unit tests and the nbval notebook runs.

Set before any kernel starts, so notebook kernels inherit them.
"""
import os

os.environ.setdefault("COURSE_FAST", "1")      # small sizes, same code path
os.environ.setdefault("WANDB_MODE", "offline")  # never reach the network
os.environ.setdefault("WANDB_SILENT", "true")
