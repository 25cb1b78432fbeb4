"""Notebook 04 §7 with the real ``peft`` (issue 54): the pinned version is the one installed, and the section's
LoRA cells (plain, then peft), run on their own in a fresh interpreter that may not touch the network, tries no connection, prints
no warning, and writes the very files the notebook's stored listing names (its claims hold: COURSE_CLAIMS=strict).
"""
from __future__ import annotations

import importlib.metadata
import json
import re
import subprocess
import sys

import pytest

from tests.support.no_network import attempts, refusing_env
from tests.support.notebook_cells import ROOT

NOTEBOOK = ROOT / "solutions" / "04_checkpoint_resume.ipynb"
# What §7's cells use from earlier cells: the notebook's imports, WORK, and nbytes (04 §5 defines it so)
PRELUDE = '''
import io, sys
from pathlib import Path
import torch
from course_tools.claims import claim
from course_tools.lab.checkpoint_resume import add_lora, pretrained_mlp, train_a_few_steps
from course_utils.env import by_size
from course_utils.models import count_parameters
WORK = Path(sys.argv[1])
def nbytes(obj):
    torch.save(obj, buffer := io.BytesIO())
    return buffer.getbuffer().nbytes
'''


def _cells() -> list[dict]:
    return json.loads(NOTEBOOK.read_text(encoding="utf-8"))["cells"]


def _source(cell: dict) -> str:
    return "".join(cell["source"])


def test_peft_is_pinned_and_installed():
    pins = dict(re.findall(r"^(peft|swanlab)==(\S+)", (ROOT / "requirements.txt").read_text(), re.MULTILINE))
    assert set(pins) == {"peft", "swanlab"}
    for name, version in pins.items():
        assert importlib.metadata.version(name) == version, f"{name}: requirements.txt pins {version}"


@pytest.mark.slow  # a fresh interpreter imports peft and transformers and trains twice five tiny steps
def test_the_peft_cell_downloads_nothing_warns_nothing_and_writes_the_listed_files(tmp_path):
    cells = _cells()
    i = next(k for k, c in enumerate(cells) if c["cell_type"] == "code" and _source(c).startswith("from peft import"))
    plain = next(_source(c) for c in cells if c["cell_type"] == "code" and "add_lora(pretrained_mlp(DIM))" in _source(c))
    run, listing = _source(cells[i]), _source(cells[i + 1])
    assert listing.startswith("# NBVAL_CHECK_OUTPUT") and "sorted(sizes)" in listing
    stored = "".join("".join(o["text"]) for o in cells[i + 1]["outputs"] if o["output_type"] == "stream")
    env, log = refusing_env(tmp_path)
    env.pop("HF_HUB_OFFLINE", None)  # nothing is downloaded even where hub access is allowed
    work = tmp_path / "work"
    work.mkdir()
    script = tmp_path / "peft_cell.py"
    script.write_text(PRELUDE + plain + run + listing)
    done = subprocess.run([sys.executable, str(script), str(work)], env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert attempts(log) == [], "peft, transformers or safetensors tried the network"
    assert done.stderr == "", "no warning, no banner"
    assert done.stdout.endswith(stored), (done.stdout, stored)  # the stored listing is this run's
    assert sorted(p.name for p in (work / "peft_adapter").iterdir()) == ["README.md", "adapter_config.json",
                                                                       "adapter_model.safetensors"]
