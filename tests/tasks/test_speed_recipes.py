"""The speed recipes of ``configs/speed/`` (issue #16 item 4) on the CPU: channels-last gives
the default layout's run, bf16 mixed precision runs in bfloat16 close to float32, compile
(slow: the inductor's compilation) the eager run; the overlays parse and are saved with the run.
The same on CUDA: ``tests/test_gpu.py``."""

from __future__ import annotations

import lightning as L
import pytest
import torch
import yaml
from torch import nn

from lmc.data import CIFAR10DataModule, write_fake_cifar10
from lmc.tasks import ClassificationTask
from tests.helpers import CONFIGS, run_cli, run_dirs


def small_convnet() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(8, 8, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, 10),
    )


class Seen(L.Callback):
    """The memory format and dtypes a training step sees."""

    def __init__(self) -> None:
        self.batch_cl: list[bool] = []
        self.weight_cl: list[bool] = []
        self.out_dtype: list[torch.dtype] = []

    def on_fit_start(self, trainer, pl_module) -> None:
        pl_module.net.register_forward_pre_hook(self._input)

    def _input(self, net, args) -> None:
        if net.training:
            self.batch_cl.append(args[0].is_contiguous(memory_format=torch.channels_last))

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        cl = torch.channels_last
        self.weight_cl.append(pl_module.net[0].weight.is_contiguous(memory_format=cl))
        with trainer.precision_plugin.forward_context(), torch.no_grad():
            self.out_dtype.append(pl_module.net[0](batch[0]).dtype)


def fit(root, precision: str = "32-true", device: str = "cpu", **task):
    L.seed_everything(0)
    if not (root / "cifar-10-batches-py").is_dir():
        write_fake_cifar10(root, n_train=64, n_test=16)
    dm = CIFAR10DataModule(str(root), batch_size=16, val_size=16, alignment_size=4)
    model = ClassificationTask(small_convnet(), **task)
    seen = Seen()
    trainer = L.Trainer(
        max_epochs=2,
        accelerator=device,
        precision=precision,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[seen],
    )
    trainer.fit(model, datamodule=dm)
    return {k: v.detach().float().cpu() for k, v in model.net.state_dict().items()}, seen


def check_channels_last(root, device: str = "cpu") -> None:
    ref, seen_ref = fit(root, device=device)
    cl, seen = fit(root, device=device, channels_last=True)
    assert seen.batch_cl and all(seen.batch_cl) and all(seen.weight_cl)
    assert not any(seen_ref.weight_cl) and not any(seen_ref.batch_cl)
    for k in ref:
        torch.testing.assert_close(cl[k], ref[k], atol=1e-4, rtol=1e-4)


def check_bf16(root, device: str = "cpu") -> None:
    ref, _ = fit(root, device=device)
    bf, seen = fit(root, precision="bf16-mixed", device=device)
    assert set(seen.out_dtype) == {torch.bfloat16}
    assert all(bf[k].dtype == torch.float32 for k in bf)  # master weights stay float32
    assert any(not torch.equal(bf[k], ref[k]) for k in ref)
    for k in ref:
        torch.testing.assert_close(bf[k], ref[k], atol=0.05, rtol=0.05)


def check_compile(root, device: str = "cpu") -> None:
    ref, _ = fit(root, device=device)
    comp, _ = fit(root, device=device, compile=True)
    assert comp.keys() == ref.keys()  # compiled in place: checkpoints keep their keys
    for k in ref:
        torch.testing.assert_close(comp[k], ref[k], atol=1e-4, rtol=1e-4)


def test_channels_last_is_the_default_layouts_run(tmp_path):
    check_channels_last(tmp_path)


def test_bf16_mixed_runs_in_bfloat16_close_to_float32(tmp_path):
    check_bf16(tmp_path)


@pytest.mark.slow
def test_compile_is_the_eager_run(tmp_path):
    check_compile(tmp_path)


def test_the_overlays_parse_and_are_saved_with_the_run(tmp_path):
    data = tmp_path / "data"
    write_fake_cifar10(data, n_train=64, n_test=16)
    run_cli(
        "fit",
        "-c",
        str(CONFIGS / "cifar10" / "tinyten.yaml"),
        "-c",
        str(CONFIGS / "loggers" / "csv.yaml"),
        "-c",
        str(CONFIGS / "speed" / "bf16.yaml"),
        "-c",
        str(CONFIGS / "speed" / "channels_last.yaml"),
        f"--data.init_args.data_dir={data}",
        "--data.init_args.val_size=16",
        "--data.init_args.alignment_size=4",
        "--data.init_args.batch_size=16",
        "--trainer.max_steps=2",
        "--trainer.enable_progress_bar=false",
        f"--trainer.default_root_dir={tmp_path / 'run'}",
    )
    [run] = run_dirs(tmp_path / "run")
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["trainer"]["precision"] == "bf16-mixed"
    assert saved["model"]["init_args"]["channels_last"] is True
    assert saved["model"]["init_args"]["compile"] is False
    compile_cfg = yaml.safe_load((CONFIGS / "speed" / "compile.yaml").read_text())
    assert compile_cfg == {"model": {"init_args": {"compile": True}}}
