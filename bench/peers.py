"""Side by side with a peer: a bare loop, our professional loop, and PyTorch Lightning's Trainer.

Same model (SmallCNN), same in-memory batches, same features where a peer has them:

- bare:      forward, cross-entropy, zero_grad, backward, AdamW step;
- ours:      ``train_step`` of solutions/homework/train_cifar_pro.py (warm-up + cosine lr, global-norm
             clipping 1.0 with the pre-clip norm kept on the device, NaN guard, EMA 0.999) + ``Monitor``
             (JSONL, one flush every 20 steps) + ``CheckpointManager`` (a full save every ``--ckpt-every`` steps);
- lightning: ``Trainer`` with ``gradient_clip_val=1.0``, the same lr schedule stepped per step,
             ``EMAWeightAveraging(decay=0.999)``, ``ModelCheckpoint(every_n_train_steps=--ckpt-every)``,
             ``CSVLogger`` with ``log_every_n_steps=20``; progress bar, model summary and sanity check off;
             the batches come through a ``DataLoader(batch_size=None)`` over the same pre-built batches
             (no collation work), 0 workers like the other two.

Throughput: one repeat runs each arm for ``--warmup`` untimed steps, then ``--steps`` timed steps; the
order of the arms rotates from repeat to repeat, so the noise of a shared machine hits all alike. A
Lightning repeat is one ``Trainer.fit``; its start-up is outside the timed window (timed from the end of
the last warm-up batch to the end of the last batch, checkpoint saves included, as for ours). Ratios are
taken per repeat; the verdict uses medians.

Exact resume: each arm trains the tiny model on 10% of the data (COURSE_FAST) in a subprocess, is killed
with SIGKILL mid-epoch twice and resumed from its newest checkpoint (ours: ``--resume``; Lightning:
``fit(ckpt_path="last")``; bare: the usual hand-written checkpoint of model, optimizer, scheduler and
epoch). Every step's loss is compared (==) with an uninterrupted run of the same arm.

Exit status 1 when ours is more than 1% slower than the bare loop, slower than Lightning (median ratio
< 1.00), or not exact after resume.

    pip install -r bench/requirements.txt
    python bench/peers.py                     # ~5 minutes on 2 CPU cores
    python bench/peers.py --steps 40 --repeats 3 --skip-resume
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import PRO_SCRIPT, format_table, header, machine_info, spread, write_json  # noqa: E402
from overhead import BareArm, ProArm, Setup, make_batches  # noqa: E402

from course_tools.noninteractive import quiet_environ  # noqa: E402
from course_utils.models import build_model  # noqa: E402
from course_utils.monitor import read_metrics  # noqa: E402
from course_utils.schedule import warmup_cosine  # noqa: E402

LOG_EVERY = 20
WARMUP_LR_STEPS = 50


# ---------------------------------------------------------------------------------------- Lightning

def lightning_module(init: torch.nn.Module, lr: float, weight_decay: float, total_steps: int,
                     loss_log: Path | None = None):
    """A LightningModule training ``init`` with AdamW and the same warm-up + cosine schedule as ours."""
    import lightning as L

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = copy.deepcopy(init)

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = F.cross_entropy(self.model(x), y)
            self.log("loss", loss, on_step=True, on_epoch=False)
            if loss_log is not None:  # the resume test compares every step's loss
                with open(loss_log, "a", encoding="utf-8") as f:
                    f.write(json.dumps({"step": self.global_step + 1, "loss": loss.item()}) + "\n")
            return loss

        def configure_optimizers(self):
            opt = torch.optim.AdamW(self.parameters(), lr=lr, weight_decay=weight_decay)
            sched = torch.optim.lr_scheduler.LambdaLR(
                opt, lambda s: warmup_cosine(s, WARMUP_LR_STEPS, total_steps))
            return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    return Module()


def lightning_trainer(workdir: Path, max_steps: int, ckpt_every: int, callbacks: list | None = None,
                      max_epochs: int = -1):
    import lightning as L
    from lightning.pytorch.callbacks import EMAWeightAveraging, ModelCheckpoint
    from lightning.pytorch.loggers import CSVLogger

    return L.Trainer(
        default_root_dir=str(workdir), accelerator="cpu", devices=1, max_steps=max_steps, max_epochs=max_epochs,
        gradient_clip_val=1.0, gradient_clip_algorithm="norm", log_every_n_steps=LOG_EVERY,
        logger=CSVLogger(str(workdir), name="csv"), enable_progress_bar=False, enable_model_summary=False,
        num_sanity_val_steps=0, limit_val_batches=0,
        callbacks=[EMAWeightAveraging(decay=0.999),
                   ModelCheckpoint(dirpath=str(workdir / "ckpt"), every_n_train_steps=ckpt_every, save_last=True,
                                   save_top_k=1)] + (callbacks or []))


class _BatchList(torch.utils.data.Dataset):
    def __init__(self, batches) -> None:
        self.batches = batches

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, i):
        return self.batches[i]


def _timer_callback(warmup: int, box: dict):
    import lightning as L

    class Timer(L.Callback):
        def on_train_batch_end(self, trainer, *args, **kwargs) -> None:  # after the step and its checkpoint
            if trainer.global_step == warmup:
                box["start"] = time.perf_counter()
            box["end"] = time.perf_counter()

    return Timer()


class LightningArm:
    """One ``Trainer.fit`` per ``run()``: ``warmup`` untimed steps, then ``steps`` timed ones."""

    def __init__(self, init: torch.nn.Module, batches, setup: Setup, workdir: Path, total_steps: int) -> None:
        self.module = lightning_module(init, setup.lr, setup.weight_decay, total_steps)
        self.batches, self.setup, self.workdir = batches, setup, workdir
        self.fits = 0

    def run(self, warmup: int, steps: int) -> float:
        box: dict = {}
        n = warmup + steps
        loader = torch.utils.data.DataLoader(_BatchList([self.batches[i % len(self.batches)] for i in range(n)]),
                                             batch_size=None, shuffle=False, num_workers=0)
        trainer = lightning_trainer(self.workdir / f"fit{self.fits}", max_steps=n, ckpt_every=self.setup.ckpt_every,
                                    callbacks=[_timer_callback(warmup, box)])
        self.fits += 1
        trainer.fit(self.module, loader)
        return box["end"] - box["start"]


# ---------------------------------------------------------------------------------------- throughput

def timed(arm, warmup: int, steps: int) -> float:
    """Seconds of ``steps`` steps of a bare/ours arm after ``warmup`` untimed ones."""
    for _ in range(warmup):
        arm.step()
    return sum(arm.step() for _ in range(steps))


class OursWithSaves(ProArm):
    """Our loop with its checkpoint saves counted in the step time (as Lightning's are)."""

    def step(self) -> float:
        before = len(self.save_times)
        seconds = super().step()
        return seconds + (self.save_times[-1] if len(self.save_times) > before else 0.0)


def throughput(setup: Setup, steps: int, warmup: int, repeats: int, log=print) -> dict:
    torch.manual_seed(setup.seed)
    device = torch.device("cpu")
    init = build_model(setup.model_name, width=setup.width)
    batches = make_batches(setup, device)
    total = repeats * (steps + warmup) + warmup
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-peers-") as tmp:
        tmp = Path(tmp)
        bare = BareArm(init, batches, setup, device)
        ours = OursWithSaves(init, batches, setup, device, tmp / "ours", total_steps=total)
        light = LightningArm(init, batches, setup, tmp / "lightning", total_steps=total)
        arms = {"bare": lambda: timed(bare, warmup, steps), "ours": lambda: timed(ours, warmup, steps),
                "lightning": lambda: light.run(warmup, steps)}
        names = list(arms)
        for r in range(repeats):
            order = names[r % 3:] + names[:r % 3]
            seconds = {name: arms[name]() for name in order}
            row = {f"{k}_sps": steps * setup.batch_size / v for k, v in seconds.items()}
            row["ours_vs_bare"] = row["ours_sps"] / row["bare_sps"]
            row["ours_vs_lightning"] = row["ours_sps"] / row["lightning_sps"]
            row["order"] = order
            rows.append(row)
            log(f"repeat {r + 1}/{repeats} ({' -> '.join(order)}): " + ", ".join(
                f"{k} {row[k + '_sps']:.0f} samples/s" for k in names))
        ours.close()
    return {"rows": rows, **{k: spread([r[k] for r in rows]) for k in
                             ("bare_sps", "ours_sps", "lightning_sps", "ours_vs_bare", "ours_vs_lightning")}}


# ---------------------------------------------------------------------------------------- exact resume

RESUME_ARGS = {"model": "tiny", "width": 8, "fraction": 0.1, "batch": 32, "epochs": 2, "ckpt_every": 4, "seed": 0}


def _resume_data():
    from course_utils.data import load_cifar10, take_fraction
    a = RESUME_ARGS
    return take_fraction(load_cifar10(True, augment=True, seed=a["seed"], quiet=True), a["fraction"])


def worker(arm: str, out: Path, resume: bool) -> int:
    """Train one arm of the resume test (run as a subprocess, killed by the parent)."""
    from course_utils.data import batches_per_epoch
    from course_utils.repro import set_seed

    a = RESUME_ARGS
    out.mkdir(parents=True, exist_ok=True)
    set_seed(a["seed"])
    ds = _resume_data()
    per_epoch = batches_per_epoch(len(ds), a["batch"], drop_last=True)
    total = a["epochs"] * per_epoch
    init = build_model(a["model"], width=a["width"])
    losses = out / "losses.jsonl"
    if arm == "lightning":
        import lightning as L
        L.seed_everything(a["seed"], workers=True, verbose=False)
        loader = torch.utils.data.DataLoader(ds, batch_size=a["batch"], shuffle=True, drop_last=True)
        module = lightning_module(init, 3e-3, 5e-4, total, loss_log=losses)
        trainer = lightning_trainer(out, max_steps=total, ckpt_every=a["ckpt_every"], max_epochs=a["epochs"])
        last = out / "ckpt" / "last.ckpt"
        trainer.fit(module, loader, ckpt_path=str(last) if resume and last.exists() else None)
        return 0
    # bare: the checkpoint most scripts write (model, optimizer, scheduler, epoch), a plain shuffled DataLoader
    model = init
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=5e-4)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: warmup_cosine(s, WARMUP_LR_STEPS, total))
    step, epoch = 0, 0
    ckpt = out / "ckpt.pt"
    if resume and ckpt.exists():
        state = torch.load(ckpt, weights_only=True)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        sched.load_state_dict(state["sched"])
        step, epoch = state["step"], state["epoch"]
    loader = torch.utils.data.DataLoader(ds, batch_size=a["batch"], shuffle=True, drop_last=True)
    while step < total:
        for i, (x, y) in enumerate(loader):
            if epoch * per_epoch + i < step:
                continue  # skip the batches done before the checkpoint
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            step += 1
            with open(losses, "a", encoding="utf-8") as f:
                f.write(json.dumps({"step": step, "loss": loss.item()}) + "\n")
            if step % a["ckpt_every"] == 0:
                torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict(),
                            "step": step, "epoch": epoch + (i + 1 == per_epoch)}, ckpt)
            if step >= total:
                break
        epoch += 1
    return 0


def _command(arm: str, out: Path, resume: bool) -> list[str]:
    if arm == "ours":
        a = RESUME_ARGS
        return [sys.executable, str(PRO_SCRIPT), "--out", str(out), "--model", a["model"], "--width", str(a["width"]),
                "--data-fraction", str(a["fraction"]), "--batch-size", str(a["batch"]), "--epochs", str(a["epochs"]),
                "--lr", "3e-3", "--warmup-steps", str(WARMUP_LR_STEPS), "--ckpt-every-steps", str(a["ckpt_every"]),
                "--log-every", "1", "--no-progress", "--seed", str(a["seed"])] + (["--resume"] if resume else [])
    return [sys.executable, __file__, "--worker", arm, "--out", str(out)] + (["--resume"] if resume else [])


def _losses(arm: str, out: Path) -> dict[int, float]:
    path = out / ("metrics.jsonl" if arm == "ours" else "losses.jsonl")
    return {int(r["step"]): float(r["loss"]) for r in read_metrics(path) if r.get("split", "train") == "train"}


def kill_and_resume(arm: str, workdir: Path, kill_at: tuple[int, ...], log=print) -> dict:
    """Uninterrupted run vs the same run killed (SIGKILL) at ``kill_at`` steps and resumed; count differing steps."""
    env = quiet_environ(override=True)
    ref, run = workdir / f"{arm}-ref", workdir / f"{arm}-killed"
    subprocess.run(_command(arm, ref, False), env=env, check=True, capture_output=True, timeout=600)
    for k, at in enumerate(kill_at):
        proc = subprocess.Popen(_command(arm, run, k > 0), env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 300
        while max(_losses(arm, run), default=0) < at and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    final = subprocess.run(_command(arm, run, True), env=env, capture_output=True, text=True, timeout=600)
    error = "" if final.returncode == 0 else (final.stderr or final.stdout).strip().splitlines()[-1][:200]
    want, got = _losses(arm, ref), _losses(arm, run)
    differ = [s for s in want if s not in got or got[s] != want[s]]
    close = [s for s in differ if s in got and math.isclose(got[s], want[s], rel_tol=1e-6)]
    log(f"{arm}: {len(differ)} of {len(want)} steps differ after kill at {kill_at} and resume"
        + (f"; the resume FAILED: {error}" if error else ""))
    return {"steps": len(want), "differ": len(differ), "differ_beyond_1e-6": len(differ) - len(close),
            "first_differing_step": differ[0] if differ else None, "resume_error": error}


# ---------------------------------------------------------------------------------------- report

def report(tp: dict | None, resume: dict | None, setup: Setup, steps: int, repeats: int) -> tuple[str, bool]:
    lines, ok = [], True
    if tp:
        lines.append(f"SmallCNN (width {setup.width}), batch {setup.batch_size}, {steps} timed steps per arm x {repeats} "
                     f"repeats (arm order rotated), checkpoint every {setup.ckpt_every} steps, logging every "
                     f"{LOG_EVERY} steps, CPU, {torch.get_num_threads()} torch thread(s)")
        lines.append("")
        lines.append(format_table([[name, tp[f"{key}_sps"]["median"], tp[f"{key}_sps"]["min"], tp[f"{key}_sps"]["max"]]
                                   for name, key in (("bare loop", "bare"), ("ours (professional loop)", "ours"),
                                                     ("Lightning Trainer", "lightning"))],
                                  ["samples/s", "median", "min", "max"]))
        lines.append("")
        lines.append(format_table([[name, tp[key]["median"], tp[key]["min"], tp[key]["max"]] for name, key in
                                   (("ours / bare", "ours_vs_bare"), ("ours / Lightning", "ours_vs_lightning"))],
                                  ["ratio (per repeat)", "median", "min", "max"]))
        vs_bare, vs_light = tp["ours_vs_bare"]["median"], tp["ours_vs_lightning"]["median"]
        lines.append(f"\nours vs bare: {100 * (1 - vs_bare):.2f}% slower (limit 1%) -> {'OK' if vs_bare >= 0.99 else 'MISSED'}; "
                     f"ours vs Lightning: x{vs_light:.3f} (goal >= 1.00) -> {'OK' if vs_light >= 1.0 else 'MISSED'}")
        ok &= vs_bare >= 0.99 and vs_light >= 1.0
    if resume:
        lines.append("")
        lines.append(f"kill -9 mid-epoch twice, then resume (tiny model, {RESUME_ARGS['fraction']:.0%} of the data, "
                     f"batch {RESUME_ARGS['batch']}, {RESUME_ARGS['epochs']} epochs, checkpoint every "
                     f"{RESUME_ARGS['ckpt_every']} steps):")
        lines.append("")
        lines.append(format_table([[arm, r["steps"], r["differ"], r["differ_beyond_1e-6"], r["first_differing_step"] or "-",
                                    r["resume_error"] or "-"] for arm, r in resume.items()],
                                  ["arm", "steps", "steps whose loss differs (==)", "differ beyond 1e-6",
                                   "first differing step", "resume error"]))
        ok &= resume["ours"]["differ"] == 0
    return "\n".join(lines), ok


def _quiet_lightning() -> None:
    """Lightning's banners and tips would drown the table (they do not change what is timed)."""
    import logging
    import warnings
    for name in ("lightning", "lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", module="lightning")
    os.environ["PYTHONWARNINGS"] = "ignore"  # the resume workers too


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=200, help="timed steps per arm and repeat")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--repeats", type=int, default=6)
    p.add_argument("--ckpt-every", type=int, default=100)
    p.add_argument("--width", type=int, default=32)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--skip-throughput", action="store_true")
    p.add_argument("--skip-resume", action="store_true")
    p.add_argument("--json", default=None)
    p.add_argument("--worker", choices=["bare", "lightning"], help=argparse.SUPPRESS)
    p.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--resume", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        torch.set_num_threads(1)
        _quiet_lightning()
        return worker(args.worker, args.out, args.resume)
    if args.threads:
        torch.set_num_threads(args.threads)
    _quiet_lightning()
    setup = Setup(width=args.width, batch_size=args.batch_size, ckpt_every=args.ckpt_every, log_every=LOG_EVERY,
                  loggers=("jsonl",))
    info = machine_info(torch.device("cpu"))
    print(header(info))
    tp = None if args.skip_throughput else throughput(setup, args.steps, args.warmup, args.repeats)
    resume = None
    if not args.skip_resume:
        with tempfile.TemporaryDirectory(prefix="bench-peers-resume-") as tmp:
            resume = {arm: kill_and_resume(arm, Path(tmp), kill_at=(7, 20)) for arm in ("bare", "ours", "lightning")}
    text, ok = report(tp, resume, setup, args.steps, args.repeats)
    print()
    print(text)
    path = write_json("peers", {"machine": info, "throughput": tp, "resume": resume, "passed": ok, "table": text},
                      args.json)
    print(f"\nJSON: {path}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
