"""Every shell command of the README and of the docs' getting-started and how-to pages runs as
written (issue 46: the merge example failed as written, getting-started named a folder a clone
does not have, the barrier recipe broke once a root held two runs), in a fresh folder whose
``configs`` is the repository's and whose ``LMC_DATA_DIR`` is a tiny fake MNIST.

Each block is either run here (in page order, in one folder, so a later page finds the runs an
earlier one trained, as a reader following the pages would) or named with why it is not."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from lmc.data import write_fake_mnist
from tests.helpers import REPO

#: in the order a reader meets the runs: the merge page takes the barrier page's endpoints
#: before the rerun examples add runs to their roots
PAGES = [
    "docs/getting-started.md",
    "docs/how-to/barrier.md",
    "docs/how-to/merge.md",
    "README.md",
    "docs/how-to/resume.md",
    "docs/how-to/study.md",
    "docs/how-to/own-model.md",
    "docs/how-to/gpu.md",
    "docs/how-to/slurm.md",
    "docs/how-to/wandb.md",
]

#: blocks not run here, by a text they hold, with why
NOT_HERE = {
    "python -m venv": "the install: .ci/run runs it from a fresh clone",
    'pip install -e ".[docs]"': "the docs site: .ci/run builds it (mkdocs build --strict)",
    "pytest": "the test suite itself",
    "--executor submitit": "a SLURM cluster: tests/studies/test_executors.py runs submitit's local "
    "executor",
    "lmc study": "studies: test_the_documented_study_commands_run_as_written (slow)",
    "configs/quickstart.yaml": "the quickstart: tests/test_cli.py runs it and checks its line",
    "vit_cifar10": "CIFAR-10 is not on disk here: tests/models/ check the ViT runs on fake CIFAR",
    "configs/speed/": "a GPU: python benchmarks/gpu.py runs the speed configs on a device",
    "learned_average": "a plugin module on the Python path: tests/studies/test_run.py runs the "
    "docs' learned_average.py from a study file",
}

#: placeholders a page leaves to the reader, and what they stand for here
PLACEHOLDERS = {
    "OUT/lmc/<run id>": "$(ls -d OUT0/lmc/*/ | head -1)",
    "<file>.ckpt": "last.ckpt",
}


def _blocks(page: str) -> list[str]:
    text = (REPO / page).read_text()
    return re.findall(r"```(?:bash|sh|console)\n(.*?)```", text, flags=re.S)


def _why_not(block: str) -> str | None:
    return next((why for key, why in NOT_HERE.items() if key in block), None)


def _runnable() -> list[tuple[str, str]]:
    seen, out = set(), []
    for page in PAGES:
        for block in _blocks(page):
            if _why_not(block) is None and block not in seen:
                seen.add(block)
                out.append((page, block))
    return out


def test_every_documented_block_is_run_or_named_with_why():
    blocks = [(p, b) for p in PAGES for b in _blocks(p)]
    assert len(blocks) > 10
    run = _runnable()
    assert {p for p, _ in run} >= {"README.md", "docs/how-to/barrier.md", "docs/how-to/merge.md"}
    for page, block in blocks:
        assert _why_not(block) or (page, block) in run or any(b == block for _, b in run)


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    root = tmp_path_factory.mktemp("documented")
    data = root / "data-read-only"
    write_fake_mnist(data, "MNIST", n_train=10200, n_test=64)  # configs: 5000 val, 5000 align
    (root / "configs").symlink_to(REPO / "configs")
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "LMC_DATA_DIR": str(data),
        "WANDB_MODE": "offline",
        "WANDB_SILENT": "true",
        **{k: str(root / "wandb-home") for k in ("WANDB_DIR", "WANDB_CONFIG_DIR")},
        "WANDB_CACHE_DIR": str(root / "wandb-cache"),
        "WANDB_DATA_DIR": str(root / "wandb-data"),
    }
    return root, env


def _run(block: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    for placeholder, value in PLACEHOLDERS.items():
        block = block.replace(placeholder, value)
    block = block.replace("/tmp/lmc-data", str(cwd / "lmc-data"))  # not the machine's /tmp
    return subprocess.run(
        ["bash", "-euo", "pipefail", "-c", block],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=600,
    )


def test_the_documented_commands_run_as_written(folder):
    cwd, env = folder
    for page, block in _runnable():
        if page == "docs/how-to/merge.md" and not (cwd / "OUT2").exists():
            # "one more seed" of the barrier page's endpoints, once
            setup = "lmc fit -c configs/mnist/mlp.yaml --seed_everything 2 --trainer.max_epochs 3"
            assert _run(f"{setup} --trainer.default_root_dir OUT2", cwd, env).returncode == 0
        done = _run(block, cwd, env)
        assert done.returncode == 0, f"{page}:\n{block}\n{done.stderr[-3000:]}"
    # what the pages promise: the barrier's and the merge's figures and summaries
    assert list(cwd.glob("OUT/lmc/*/interpolation.png")) and list(cwd.glob("OUT/lmc/*/merge.png"))
    assert (cwd / "lmc-data" / "MNIST" / "raw").is_dir()  # getting-started's writable copy


@pytest.mark.slow
def test_the_documented_study_commands_run_as_written(folder):
    cwd, env = folder
    for page in ("README.md", "docs/how-to/study.md"):
        for block in _blocks(page):
            if "lmc study" in block:
                done = _run(block, cwd, env)
                assert done.returncode == 0, f"{page}:\n{block}\n{done.stderr[-3000:]}"
    assert (cwd / "studies" / "003_width" / "report" / "report.html").is_file()
