"""prime-rl PR #3332: every resumed run restarted the data from the beginning: the data iterator was built
(``iter()``) before ``load_state_dict`` gave it the saved position.

Expected: data order (restarted from the beginning), at the first resumed step."""
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[2])]
from common import Run  # noqa: E402


class Bug(Run):
    def restore(self, s: dict) -> None:
        super().restore(s)
        self.epoch, self.batch = 0, 0  # the position reached an iterator that was already built

if __name__ == "__main__":
    Bug().main()
