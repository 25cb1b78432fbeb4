"""An optimizer left out of the checkpoint: AdamW resumes with empty moments.

Expected: optimizer state, right after loading, before the first resumed step."""
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[2])]
from common import Run  # noqa: E402


class Bug(Run):
    left_out = ("opt",)


if __name__ == "__main__":
    Bug().main()
