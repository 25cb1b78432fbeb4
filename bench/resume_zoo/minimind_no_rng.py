"""MiniMind's resume file has no RNG state: dropout draws other masks after a resume.

Expected: RNG state, at the first resumed step (same weights, same batch, other outputs)."""
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[2])]
from common import Run  # noqa: E402


class Bug(Run):
    left_out = ("rng",)


if __name__ == "__main__":
    Bug().main()
