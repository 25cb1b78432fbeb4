"""MiniMind's resume file stores the weights as ``v.half()``: the resumed weights are rounded to fp16.

Expected: weights (rounded to float16), right after loading, before the first resumed step."""
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[2])]
from common import Run  # noqa: E402


class Bug(Run):
    def state(self) -> dict:
        return {**super().state(), "model": {k: v.half() for k, v in self.model.state_dict().items()}}

if __name__ == "__main__":
    Bug().main()
