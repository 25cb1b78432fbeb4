"""Resuming one step early: the checkpoint's own step is trained again (the step counter and the data cursor
start at the saved step instead of after it).

Expected: step counter (repeated), at the first resumed step."""
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[2])]
from common import Run  # noqa: E402


class Bug(Run):
    def restore(self, s: dict) -> None:
        super().restore(s)
        self.step, self.batch = self.step - 1, max(0, self.batch - 1)

if __name__ == "__main__":
    Bug().main()
