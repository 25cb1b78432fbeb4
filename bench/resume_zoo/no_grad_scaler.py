"""A GradScaler left out of the checkpoint: the resumed scaler starts again from its initial scale and an empty
growth tracker. The zoo's run trains in fp32, where scaling by a power of two is exact, so the weights stay those
of the uninterrupted run: only the scaler's state shows the bug (under fp16 autocast the scale decides which steps
overflow and are skipped, and the weights part too).

Expected: GradScaler, right after loading, before the first resumed step."""
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[2])]
from common import Run  # noqa: E402


class Bug(Run):
    left_out = ("scaler",)


if __name__ == "__main__":
    Bug().main()
