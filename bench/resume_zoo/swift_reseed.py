"""ms-swift PR #9935: the global RNG is seeded again after the checkpoint restored it.

Expected: RNG state, at the first resumed step."""
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[2])]
from common import Run  # noqa: E402


class Bug(Run):
    def restore(self, s: dict) -> None:
        super().restore(s)
        self.seed_all(self.args.seed)  # "make the resumed run reproducible": undoes the restored RNG state

if __name__ == "__main__":
    Bug().main()
