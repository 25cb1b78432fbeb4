"""A scheduler left out of the checkpoint: the optimizer's state restores this step's lr, the fresh LambdaLR
counts from 0 at the next scheduler step.

Expected: lr scheduler, at the second resumed step."""
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[2])]
from common import Run  # noqa: E402


class Bug(Run):
    left_out = ("sched",)


if __name__ == "__main__":
    Bug().main()
