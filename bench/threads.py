"""CPU threads for the notebooks: 1 torch thread vs one per core, on a quiet machine and with one core busy.

The question behind ``course_utils.env.configure_cpu_threads``: on a small CPU, should torch use
every core? Each arm trains the workbook's SmallCNN (width 32, batch 128, AdamW) for ``--steps``
steps; arms alternate (1 thread, all cores, all cores, 1 thread, ...) so drift hits both alike.
"Busy" runs one extra process spinning on the CPU, as a notebook server, a DataLoader worker or
a second kernel would.

    python bench/threads.py                   # ~2 minutes on 2 cores
    python bench/threads.py --steps 10 --repeats 3
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import format_table, header, machine_info, spread, write_json  # noqa: E402

from course_utils.env import usable_cores  # noqa: E402
from course_utils.models import build_model  # noqa: E402


def _spin(stop) -> None:
    while not stop.is_set():
        pass


def time_steps(threads: int, steps: int, batch: tuple[torch.Tensor, torch.Tensor]) -> float:
    """Seconds for ``steps`` training steps of a fresh SmallCNN with ``threads`` torch threads."""
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = build_model("small")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = batch
    F.cross_entropy(model(x), y).backward()  # warm-up: allocator and kernels, not timed
    start = time.perf_counter()
    for _ in range(steps):
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return time.perf_counter() - start


def measure(steps: int, repeats: int, busy: bool, many: int) -> dict[str, list[float]]:
    gen = torch.Generator().manual_seed(0)
    batch = (torch.randn(128, 3, 32, 32, generator=gen), torch.randint(0, 10, (128,), generator=gen))
    stop = mp.Event()
    spinner = mp.Process(target=_spin, args=(stop,), daemon=True) if busy else None
    if spinner:
        spinner.start()
    times: dict[str, list[float]] = {"1": [], str(many): []}
    try:
        for r in range(repeats):
            order = (1, many) if r % 2 == 0 else (many, 1)
            for threads in order:
                times[str(threads)].append(time_steps(threads, steps, batch))
    finally:
        if spinner:
            stop.set()
            spinner.join(5)
            if spinner.is_alive():
                spinner.kill()
    return times


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--repeats", type=int, default=4)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    many = max(2, usable_cores())
    info = machine_info("cpu")
    print(header(info))
    rows, raw = [], {}
    for busy in (False, True):
        label = "one core busy" if busy else "quiet"
        t = measure(args.steps, args.repeats, busy, many)
        raw[label] = t
        one, all_ = spread(t["1"]), spread(t[str(many)])
        rows.append([label, f"{one['median']:.2f} ({one['min']:.2f}-{one['max']:.2f})",
                     f"{all_['median']:.2f} ({all_['min']:.2f}-{all_['max']:.2f})", all_["median"] / one["median"]])
        print(f"{label}: 1 thread {one['median']:.2f} s, {many} threads {all_['median']:.2f} s", flush=True)
    text = (f"SmallCNN (width 32), batch 128, {args.steps} AdamW steps per timing, {args.repeats} alternating repeats\n\n"
            + format_table(rows, ["machine", "1 thread, s (median, min-max)", f"{many} threads, s",
                                  f"{many} threads / 1 thread"]))
    print()
    print(text)
    path = write_json("threads", {"machine": info, "steps": args.steps, "repeats": args.repeats, "cores": many,
                                  "seconds": raw, "table": text}, args.json)
    print(f"\nJSON: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
