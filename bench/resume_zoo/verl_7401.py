"""verl #7401: a job resumed at an epoch boundary silently skips an epoch (the saved epoch is already the next
one, and the resume counts it as finished) and exits 0.

Expected: data order (an epoch skipped), at the first step after the epoch end."""
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[2])]
from common import Run  # noqa: E402


class Bug(Run):
    def restore(self, s: dict) -> None:
        super().restore(s)
        if self.batch == 0:
            self.epoch += 1

if __name__ == "__main__":
    Bug().main()
