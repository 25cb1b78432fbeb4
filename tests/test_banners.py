"""No third-party banner or warning in what the notebooks show (issue 33: the learner's first hour in JupyterLab).

A learner reads a pink stderr block, a ``UserWarning`` or a library's log line as "my code is broken". The
learner copies carry no outputs (``course_tools.release`` clears them); the solutions' stored outputs are the
run a learner's Run All repeats (``release --execute``: the same cells with ``COURSE_FAST=1``, and ipykernel
forwards what C++ code writes to file descriptors 1 and 2 into them), so those are read here.
"""
from __future__ import annotations

import json
import re

from course_tools import release

# What third-party libraries print unasked, each with an example of the line it stands for.
BANNERS = [
    r"\b[A-Z]\w*Warning\b:",                        # warnings.showwarning: ".../dataloader.py:627: UserWarning: ..."
    r"^wandb: ",                                    # wandb's banner: "wandb: Tracking run with wandb version ..."
    r"^swanlab: ",                                  # swanlab's console: "swanlab: ⚡️ Run `swanlab sync ...` to sync"
    r"TensorFlow|tensorflow|oneDNN custom operations",  # "TensorFlow installation not found - running with ..."
    r"^\[?[WIEF]\d{4} \d\d:\d\d:\d\d",              # c10 / glog / torchrun logging: "[W1203 08:43:14.12 ...]"
    r"NCCL (INFO|WARN)|\[Gloo\]|ProcessGroupGloo",  # collective backends' log lines
    r"^OMP: |^KMP_|libgomp",                         # the OpenMP runtime: "OMP: Info #276: omp_set_nested ..."
    r"findfont: |missing from font|building the font cache",  # matplotlib without a CJK font, first import
    r"\d+%\|.*\| *\d+/\d+ \[",                      # a tqdm bar: "100%|██████████| 24/24 [00:01<00:00, ...]"
]
# Lines we print on purpose that look like the above.
ALLOWED = [
    r"^sanity run: +\d+%\|",                        # 00's own tqdm.auto bar over the sanity run's batches
    r"^wandb: (offline|online) 模式,run 文件夹 ",     # WandbSink's one line (course_utils.sinks; wandb is silent)
    r"^swanlab: (offline|local|online) 模式,run id ",  # SwanLabSink's one line (its console silenced meanwhile)
]
_BANNER, _ALLOWED = re.compile("|".join(BANNERS)), re.compile("|".join(ALLOWED))


def _text(output: dict) -> str:
    """What one stored output shows as text: a stream's text, a rich output's text/plain (nbformat: str or lines)."""
    text = output.get("text") if output["output_type"] == "stream" else output.get("data", {}).get("text/plain", "")
    return "".join(text) if isinstance(text, list) else text or ""


def noise(line: str) -> bool:
    """Whether ``line`` looks like a third-party banner or warning and is not one we print on purpose."""
    return bool(_BANNER.search(line)) and not _ALLOWED.search(line)


def test_the_patterns_catch_real_banners_and_spare_our_own_lines() -> None:
    banners = ["/x/torch/utils/data/dataloader.py:627: UserWarning: This DataLoader will create 8 worker processes",
               "  warnings.warn(  FutureWarning: `torch.cuda.amp.GradScaler(args...)` is deprecated",
               "wandb: Tracking run with wandb version 0.19.1", "wandb: W&B syncing is set to `offline`",
               "TensorFlow installation not found - running with reduced feature set.",
               "[W1203 08:43:14.123456 4711 ProcessGroupGloo.cpp:727] Warning: Unable to resolve hostname",
               "W1203 08:43:14.917000 4711 torch/distributed/run.py:793] Setting OMP_NUM_THREADS",
               "OMP: Info #276: omp_set_nested routine deprecated", "findfont: Font family 'SimHei' not found.",
               "100%|██████████| 24/24 [00:01<00:00, 20.1it/s]",
               "swanlab: 💾 Run data saved at /tmp/x/swanlog/run-20261206_004811-445h1k3x"]
    ours = ["sanity run:   0%|          | 0/24 [00:00<?, ?it/s]",
            "wandb: offline 模式,run 文件夹 offline-run-20261203_084314-c6794d8d(wandb 自己的消息在它的 logs/debug.log)",
            "swanlab: offline 模式,run id 445h1k3x,日志在 /tmp/x/swanlog/run-20261206_004811-445h1k3x(swanlab 自己的消息在它的 debug/)",
            "torch 2.14.1+cu130 · notebook 进程的 torch 线程数 1 · gloo 可用: True",
            "GradScaler(\"cuda\", enabled=False) 的警告: 无", "⚠️  [ALERT] rolled back: step 12"]
    assert [line for line in banners if not noise(line)] == []
    assert [line for line in ours if noise(line)] == []


def test_no_stored_output_is_stderr_or_a_third_party_banner() -> None:
    found, outputs = [], 0
    for path in release.solution_paths():
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        for index, cell in enumerate(cells):
            for output in cell.get("outputs", []):
                outputs += 1
                where = f"{path.name} #{index}"
                if output.get("name") == "stderr":
                    found.append(f"{where} stderr: {_text(output)[:200]}")
                found += [f"{where}: {line[:200]}" for line in _text(output).splitlines() if noise(line)]
    assert outputs > 100, outputs          # the stored runs are there: the scan is not vacuous
    assert not found, "\n".join(found)
