"""An EMA left out of the checkpoint: the resumed EMA starts again from the loaded weights.

Expected: EMA, right after loading, before the first resumed step."""
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[2])]
from common import Run  # noqa: E402


class Bug(Run):
    left_out = ("ema",)


if __name__ == "__main__":
    Bug().main()
