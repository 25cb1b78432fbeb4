"""Control: the zoo's tiny run as it should be (every state saved, the order a function of (seed, epoch))."""
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[2])]
from common import Run  # noqa: E402

if __name__ == "__main__":
    Run().main()
