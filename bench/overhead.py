"""Overhead of the professional training loop against a bare loop (same model, data, steps).

(a) bare:  forward, cross-entropy, zero_grad, backward, AdamW step.
(b) pro:   the loop of solutions/homework/train_cifar_pro.py: LR schedule, clip_gradients
           (global norm 1.0, pre-clip norm kept on the device), the NaN-skip check,
           EMA(0.999, warm-up), Monitor(loggers=("jsonl", "tensorboard"), progress=False,
           flush_every=20), a full CheckpointManager save every 200 steps and the hang watchdog's
           heartbeat (course_utils.heartbeat: a phase change per part of the step, published to a
           memory-mapped file, and each rank's times taken at every flush).

Both arms read the same pre-generated in-memory batches, start from the same initial
weights and live in one process; their steps alternate one by one (a-b, b-a, a-b, ...) so
that the noise of a shared machine hits both alike. One repeat = ``--steps`` timed
optimizer steps per arm; the pro/bare throughput ratio is taken per repeat, and the
verdict uses the median over repeats.

Checkpoint cost: the pro arm saves a full training state (model, AdamW, scheduler, EMA,
RNG, monitor state) every ``--ckpt-every`` steps of its own step count and once more at
the end of each repeat without one; every save is timed on its own and charged pro rata
(``median save seconds * steps / ckpt_every``), which is what a save every N steps costs
per step, whatever the repeat length.

Threads: torch's default by default; use ``--threads 1`` on a shared, busy machine (two
OpenMP threads on two busy cores wait for each other at every op). Fewer threads make each step slower, so a fixed per-step
overhead is a smaller fraction; the profile table shows the absolute ms per part.

Heartbeat cost: the four phase changes a step makes (data, forward, backward, optimizer), timed alone
over many repetitions, as a fraction of the professional loop's median step (limit 0.5%, issue 34).

Exit status 1 when the median (over repeats) slowdown exceeds ``--max-overhead`` (3%), or the heartbeat
costs more than 0.5% of a step.

    python bench/overhead.py                    # auto-sized to ~2-3 minutes
    python bench/overhead.py --steps 200 --repeats 5 --batch-size 128
"""
from __future__ import annotations

import argparse
import copy
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import format_table, header, load_pro_script, machine_info, spread, write_json  # noqa: E402

from course_utils.amp import make_grad_scaler  # noqa: E402
from course_utils.checkpoint import CheckpointManager, training_state  # noqa: E402
from course_utils.data import MEAN, STD, synthetic_cifar10  # noqa: E402
from course_utils.ema import EMA  # noqa: E402
from course_utils.heartbeat import Heartbeat  # noqa: E402
from course_utils.models import build_model, count_parameters  # noqa: E402
from course_utils.monitor import Monitor  # noqa: E402
from course_utils.schedule import make_scheduler  # noqa: E402



@dataclass
class Setup:
    model_name: str = "small"
    width: int = 32
    batch_size: int = 128
    n_batches: int = 8
    lr: float = 2e-3
    weight_decay: float = 5e-4
    clip: float = 1.0
    ema_decay: float = 0.999
    log_every: int = 20
    ckpt_every: int = 200
    loggers: tuple = ("jsonl", "tensorboard")
    seed: int = 0


def make_batches(setup: Setup, device: torch.device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``n_batches`` normalised CIFAR-shaped batches, generated once and kept in memory."""
    n = setup.batch_size * setup.n_batches
    images, labels = synthetic_cifar10(n, seed=1)
    x = torch.from_numpy(images).permute(0, 3, 1, 2).float().div_(255)
    x = (x - torch.tensor(MEAN).view(1, 3, 1, 1)) / torch.tensor(STD).view(1, 3, 1, 1)
    y = torch.tensor(labels)
    return [(x[i:i + setup.batch_size].contiguous().to(device), y[i:i + setup.batch_size].to(device))
            for i in range(0, n, setup.batch_size)]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class BareArm:
    """The bare loop, one optimizer step per ``step()`` call."""

    def __init__(self, init: torch.nn.Module, batches, setup: Setup, device: torch.device) -> None:
        self.model = copy.deepcopy(init).train()
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=setup.lr, weight_decay=setup.weight_decay)
        self.batches, self.device, self.i = batches, device, 0

    def step(self) -> float:
        """Seconds for one step."""
        _sync(self.device)
        start = time.perf_counter()
        x, y = self.batches[self.i % len(self.batches)]
        loss = F.cross_entropy(self.model(x), y)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        _sync(self.device)
        self.i += 1
        return time.perf_counter() - start

    def close(self) -> None:
        pass


class ProArm:
    """The professional loop of train_cifar_pro.py, one optimizer step per ``step()`` call.

    ``step()`` returns the step's seconds without any checkpoint save; save times are
    collected in ``save_times`` (in-loop saves every ``ckpt_every`` steps, plus explicit
    ``save()`` calls). ``timers`` accumulates the seconds of each part of the step
    (meaningful on CPU; on a GPU the parts would each need a sync to be attributed).

    Each arm loads its own copy of the script and calls the script's ``train_step``: the bench
    measures the real code. With ``profile``, the parts ``train_step`` calls are timed from outside
    (``train_step`` holds no timing code): ``forward_backward`` and ``clip_gradients`` wrapped in the
    arm's copy of the script, the optimizer's step pre/post hooks, stand-ins for the scheduler and
    the EMA whose ``step``/``update`` call the real ones (the real ones are what a checkpoint saves).
    A part is charged the time since the previous part ended.
    """

    def __init__(self, init: torch.nn.Module, batches, setup: Setup, device: torch.device, workdir: Path,
                 total_steps: int = 1000, profile: bool = False) -> None:
        self.model = copy.deepcopy(init).train()
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=setup.lr, weight_decay=setup.weight_decay)
        self.scheduler = make_scheduler(self.optimizer, 50, max(total_steps, 100))
        self.amp_dtype = None  # fp32: the AMP comparison lives in bench/amp.py
        self.scaler = make_grad_scaler(device, self.amp_dtype)
        self.ema = EMA(self.model, decay=setup.ema_decay, warmup=True) if setup.ema_decay > 0 else None
        self.manager = CheckpointManager(workdir / "checkpoints", keep_last=2, every_steps=setup.ckpt_every,
                                         every_seconds=3600.0)
        self.monitor = Monitor(workdir, setup.loggers, flush_every=setup.log_every, device=device,
                               total_steps=total_steps, config={"bench": "overhead"}, progress=False)
        self.setup, self.batches, self.device = setup, batches, device
        self.step_count = 0
        self.save_times: list[float] = []
        self.profile = profile
        self.timers: dict[str, float] = {}
        self._last = 0.0
        self.pro = load_pro_script()  # this arm's own copy: its wrapped parts time this arm only
        self.beat = Heartbeat()
        (workdir / "heartbeats").mkdir()
        self.beat.publish(workdir / "heartbeats" / "rank_0.hb", {"rank": 0, "pid": 0, "host": "", "job": ["", "0"]})
        self.beat.attach(self.model, self.optimizer)
        self.step_scheduler, self.step_ema = self._time_parts() if profile else (self.scheduler, self.ema)

    def _phase(self, name: str) -> None:
        """Charge the time since the previous mark to ``name``."""
        now = time.perf_counter()
        if self.profile:
            self.timers[name] = self.timers.get(name, 0.0) + now - self._last
        self._last = now

    def _timed(self, fn, name: str):
        """``fn``, charging ``name`` when it returns."""
        def timed(*args, **kwargs):
            out = fn(*args, **kwargs)
            self._phase(name)
            return out
        return timed

    def _time_parts(self) -> tuple[SimpleNamespace, SimpleNamespace | None]:
        """Time each part of ``train_step``; the scheduler and EMA stand-ins to pass to it."""
        self.pro.forward_backward = self._timed(self.pro.forward_backward, "forward+backward")
        self.pro.clip_gradients = self._timed(self.pro.clip_gradients, "clip")
        self.optimizer.register_step_pre_hook(lambda *_: self._phase("isfinite check"))  # the one host read
        self.optimizer.register_step_post_hook(lambda *_: self._phase("optimizer+scheduler"))
        scheduler = SimpleNamespace(step=self._timed(self.scheduler.step, "optimizer+scheduler"))
        return scheduler, None if self.ema is None else SimpleNamespace(update=self._timed(self.ema.update, "ema"))

    def save(self) -> float:
        """One full checkpoint, as the script's ``save()``: flush the monitor, then save."""
        _sync(self.device)
        start = time.perf_counter()
        m = self
        with m.monitor.paused():
            m.monitor.flush()
            m.manager.save(training_state(model=m.model, optimizer=m.optimizer, scheduler=m.scheduler,
                                          scaler=m.scaler, ema=m.ema, epoch=0, step=m.step_count,
                                          batch_in_epoch=m.step_count, config={"bench": "overhead"},
                                          extra={"monitor": m.monitor.state_dict()}), m.step_count)
        _sync(self.device)
        seconds = time.perf_counter() - start
        self.save_times.append(seconds)
        return seconds

    def step(self) -> float:
        """Seconds for one step, excluding a checkpoint save if one fell on this step."""
        _sync(self.device)
        start = time.perf_counter()
        self._last = start
        self.beat.enter("data", self.step_count + 1)
        x, y = self.batches[self.step_count % len(self.batches)]
        result = self.pro.train_step(self.model, x, y, optimizer=self.optimizer, scheduler=self.step_scheduler,
                                     scaler=self.scaler, ema=self.step_ema, device=self.device,
                                     amp_dtype=self.amp_dtype, clip=self.setup.clip)
        self.step_count += 1
        self.monitor.log_step(self.step_count, 0, result.loss, result.clip.norm, result.clip.clipped, result.lr,
                              len(y), skipped=result.skipped)
        if self.step_count % self.setup.log_every == 0:
            self.beat.take_times()  # the script gathers them from every rank here
        self._phase("monitor")
        saved = 0.0
        if self.manager.should_save(self.step_count):
            saved = self.save()
        _sync(self.device)
        return time.perf_counter() - start - saved

    def close(self) -> None:
        self.monitor.close()


HEARTBEAT_LIMIT = 0.005  # issue 34: the hang watchdog's heartbeat costs at most 0.5% of a step


def heartbeat_seconds_per_step(folder: Path, repeats: int = 20_000) -> float:
    """The four phase changes of one step (data, forward, backward, optimizer), each published, timed alone."""
    beat = Heartbeat()
    beat.publish(folder / "rank_0.hb", {"rank": 0, "pid": 0, "host": "", "job": ["", "0"]})
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for step in range(repeats):
            beat.enter("data", step)
            beat.enter("forward")
            beat.enter("backward")
            beat.enter("optimizer")
        best = min(best, (time.perf_counter() - start) / repeats)
    beat.close()
    return best


def measure(setup: Setup, steps: int, repeats: int, device: torch.device, warmup: int = 3,
            budget_s: float | None = None, log=print) -> dict:
    """Alternate one bare and one pro step (order flipped every pair) for ``steps`` steps per arm
    and repeat; one explicit checkpoint save per repeat feeds the pro-rata checkpoint charge."""
    torch.manual_seed(setup.seed)
    init = build_model(setup.model_name, width=setup.width).to(device)
    batches = make_batches(setup, device)
    with tempfile.TemporaryDirectory(prefix="bench-overhead-") as tmp:
        tmp = Path(tmp)
        bare = BareArm(init, batches, setup, device)
        warm = [bare.step() for _ in range(warmup)]  # allocator, kernels: not timed
        if not steps:  # auto: fit ~budget_s of timed work (2 arms x repeats)
            per_step = min(warm)
            steps = int(budget_s / (2 * repeats * per_step * 1.1)) if budget_s else 40
            steps = max(setup.log_every, min(setup.ckpt_every, steps // setup.log_every * setup.log_every))
            log(f"auto: {per_step * 1000:.0f} ms/step in warm-up -> {steps} steps per arm and repeat")
        pro = ProArm(init, batches, setup, device, tmp / "pro", total_steps=steps * repeats + warmup, profile=True)
        for _ in range(warmup):
            pro.step()
        pro.timers.clear()
        samples = steps * setup.batch_size
        rows = []
        for r in range(repeats):
            t_bare = t_pro = 0.0
            in_loop_saves = len(pro.save_times)
            for i in range(steps):
                if (i + r) % 2 == 0:
                    t_bare += bare.step()
                    t_pro += pro.step()
                else:
                    t_pro += pro.step()
                    t_bare += bare.step()
            in_loop_saves = len(pro.save_times) - in_loop_saves
            if not in_loop_saves:
                pro.save()  # measured once per repeat, charged pro rata below
            save_s = pro.save_times[-1]
            t_pro_eff = t_pro + save_s * steps / setup.ckpt_every
            res = {"bare_s": t_bare, "pro_loop_s": t_pro, "save_s": save_s, "pro_s": t_pro_eff,
                   "bare_sps": samples / t_bare, "pro_sps": samples / t_pro_eff}
            res["ratio"] = res["pro_sps"] / res["bare_sps"]
            rows.append(res)
            log(f"repeat {r + 1}/{repeats}: bare {res['bare_sps']:.1f} samples/s, pro {res['pro_sps']:.1f} "
                f"samples/s, ratio {res['ratio']:.4f}")
        timers = dict(pro.timers)
        timers["checkpoint (pro rata)"] = statistics.median(pro.save_times) / setup.ckpt_every * steps * repeats
        pro.close()
        bare.close()
        beat_s = heartbeat_seconds_per_step(tmp)
    ratio = spread([r["ratio"] for r in rows])
    pro_step_s = setup.batch_size / statistics.median(r["pro_sps"] for r in rows)
    return {
        "setup": setup.__dict__ | {"loggers": list(setup.loggers)},
        "device": str(device),
        "torch_threads": torch.get_num_threads(),
        "params": count_parameters(init),
        "steps_per_repeat": steps,
        "repeats": repeats,
        "rows": rows,
        "bare_sps": spread([r["bare_sps"] for r in rows]),
        "pro_sps": spread([r["pro_sps"] for r in rows]),
        "save_s": spread(pro.save_times),
        "ratio": ratio,
        "overhead": 1.0 - ratio["median"],
        "heartbeat_s_per_step": beat_s,
        "heartbeat_fraction": beat_s / pro_step_s,
        "profile_ms_per_step": {k: 1000 * v / (steps * repeats) for k, v in timers.items()},
    }


def report(result: dict, max_overhead: float) -> str:
    s = result["setup"]
    ckpt_note = f"full save every {s['ckpt_every']} steps, its measured time charged pro rata"
    lines = [f"model {s['model_name']} (width {s['width']}, {result['params']:,} params), batch {s['batch_size']}, "
             f"{result['steps_per_repeat']} steps per arm x {result['repeats']} repeats (bare/pro steps alternated), "
             f"device {result['device']} ({result['torch_threads']} torch threads); pro = clip {s['clip']} + EMA {s['ema_decay']} + Monitor"
             f"({'+'.join(s['loggers'])}, flush every {s['log_every']}) + checkpoint ({ckpt_note})", ""]
    rows = []
    for name, key in (("bare loop", "bare_sps"), ("professional loop", "pro_sps")):
        v = result[key]
        rows.append([name, v["median"], v["min"], v["max"]])
    lines.append(format_table(rows, ["samples/s", "median", "min", "max"]))
    r = result["ratio"]
    lines += ["", format_table([["pro / bare throughput", r["median"], r["min"], r["max"], r["q1"], r["q3"]]],
                               ["ratio (per repeat)", "median", "min", "max", "q1", "q3"])]
    prof = result["profile_ms_per_step"]
    total = sum(prof.values())
    lines += ["", "where the pro loop's time goes (all timed pro steps, ms per step):",
              format_table([[k, v, 100 * v / total] for k, v in sorted(prof.items(), key=lambda kv: -kv[1])],
                           ["part", "ms/step", "% of step"])]
    lines += ["", f"checkpoint save: median {result['save_s']['median'] * 1000:.1f} ms "
              f"(min {result['save_s']['min'] * 1000:.1f}, max {result['save_s']['max'] * 1000:.1f})",
              f"overhead (median over repeats): {100 * result['overhead']:.2f}%  "
              f"(limit {100 * max_overhead:.1f}%) -> {'OK' if result['overhead'] <= max_overhead else 'TOO SLOW'}",
              f"heartbeat (4 phase changes per step, timed alone): {result['heartbeat_s_per_step'] * 1e6:.1f} us per "
              f"step = {100 * result['heartbeat_fraction']:.3f}% of the pro step (limit {100 * HEARTBEAT_LIMIT:.1f}%) -> "
              f"{'OK' if result['heartbeat_fraction'] <= HEARTBEAT_LIMIT else 'TOO SLOW'}"]
    return "\n".join(lines)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=0, help="timed steps per arm and repeat (0: auto from --budget)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--budget", type=float, default=130.0, help="seconds of timed work for --steps 0")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--model", choices=["small", "tiny"], default="small")
    p.add_argument("--width", type=int, default=32)
    p.add_argument("--ckpt-every", type=int, default=200)
    p.add_argument("--log-every", type=int, default=20)
    p.add_argument("--max-overhead", type=float, default=0.03, help="allowed median slowdown (0.03 = 3%%)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=0,
                   help="torch.set_num_threads (0: torch's default). Use 1 on a shared, busy machine: "
                        "two OpenMP threads on two busy cores wait for each other at every op")
    p.add_argument("--json", default=None, help="output file (default bench/results/overhead.json)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    setup = Setup(model_name=args.model, width=args.width, batch_size=args.batch_size,
                  ckpt_every=args.ckpt_every, log_every=args.log_every)
    info = machine_info(device)
    print(header(info))
    result = measure(setup, args.steps, args.repeats, device, budget_s=args.budget)
    text = report(result, args.max_overhead)
    print()
    print(text)
    passed = result["overhead"] <= args.max_overhead and result["heartbeat_fraction"] <= HEARTBEAT_LIMIT
    path = write_json("overhead", {"machine": info, **result, "max_overhead": args.max_overhead,
                                   "passed": passed, "table": text}, args.json)
    print(f"\nJSON: {path}")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
