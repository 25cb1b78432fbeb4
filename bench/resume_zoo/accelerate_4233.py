"""Accelerate PR #4233: a mid-epoch save captures the shuffle generator after this epoch's permutation was drawn
from it; the resume shuffles the interrupted epoch again from that advanced state: an order the uninterrupted
run never used (upstream: the next epoch's, which then comes twice).

Expected: data order, at the first resumed step."""
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[2])]
from accelerate_4195 import Bug as OneGenerator  # noqa: E402


class Bug(OneGenerator):
    def state(self) -> dict:  # mid-epoch, the generator has already drawn this epoch's permutation
        return {**super().state(), "order": self.order.get_state()}

    def restore(self, s: dict) -> None:
        super().restore(s)
        self.order.set_state(s["order"])


if __name__ == "__main__":
    Bug().main()
