"""ClassSubset: one task of a disjoint-task split keeps exactly its classes in every split, with
the wrapped module's examples and loaders; bad class lists are refused by name; `lmc fit` trains
on it from YAML."""

from __future__ import annotations

import pytest
import torch

from lmc.data import ClassSubset, MNISTDataModule, TeacherStudentDataModule, class_counts
from lmc.data.fake import write_fake_mnist
from tests.helpers import CONFIGS, checkpoints, run_cli, run_dirs


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("subset")
    write_fake_mnist(root, "MNIST", n_train=200, n_test=100)
    return root


def _full(root) -> MNISTDataModule:
    return MNISTDataModule(str(root), batch_size=16, val_size=40, alignment_size=30)


def _labels(loader) -> torch.Tensor:
    return torch.cat([b[1] for b in loader])


def test_every_split_keeps_exactly_the_tasks_classes(root):
    full, task = _full(root), ClassSubset(_full(root), [0, 1, 2, 3, 4])
    for split in ("train_dataset", "val_dataset", "alignment_dataset", "test_dataset"):
        whole, part = getattr(full, split), getattr(task, split)
        assert class_counts(part) == {c: n for c, n in class_counts(whole).items() if c < 5}, split
    assert set(_labels(task.train_dataloader()).tolist()) <= {0, 1, 2, 3, 4}
    assert set(_labels(task.alignment_dataloader()).tolist()) <= {0, 1, 2, 3, 4}
    # the same examples as the wrapped module's, in its order
    x_full = torch.cat([b[0] for b in full.test_dataloader()])
    y_full = _labels(full.test_dataloader())
    x_part = torch.cat([b[0] for b in task.test_dataloader()])
    assert torch.equal(x_part, x_full[y_full < 5])
    assert task.num_classes == 10 and task.batch_size == 16  # the wrapped module's


@pytest.mark.parametrize(
    ("classes", "message"),
    [([], "distinct labels in \\[0, 10\\)"), ([3, 3], "got \\[3, 3\\]"), ([10], "got \\[10\\]")],
)
def test_a_bad_class_list_is_refused_by_name(root, classes, message):
    with pytest.raises(ValueError, match=f"data.init_args.classes must list .*{message}"):
        ClassSubset(_full(root), classes)


def test_a_regression_data_module_is_refused():
    with pytest.raises(ValueError, match="keeps classes of a classification data module"):
        ClassSubset(TeacherStudentDataModule(n_train=10, n_val=0, n_test=0), [0])


def test_lmc_fit_trains_on_one_task_from_yaml(root, tmp_path):
    run_cli(
        "fit",
        "-c",
        str(CONFIGS / "mnist" / "mlp.yaml"),
        "-c",
        str(CONFIGS / "loggers" / "csv.yaml"),
        "--data=lmc.data.ClassSubset",
        "--data.classes=[5, 6, 7, 8, 9]",
        "--data.data=lmc.data.MNISTDataModule",
        f"--data.data.data_dir={root}",
        "--data.data.val_size=40",
        "--data.data.alignment_size=30",
        "--data.data.batch_size=32",
        "--model.init_args.net.init_args.width=16",
        "--trainer.max_epochs=1",
        "--trainer.enable_progress_bar=false",
        f"--trainer.default_root_dir={tmp_path}",
        f"--trainer.logger.init_args.save_dir={tmp_path}",
    )
    [run] = run_dirs(tmp_path)
    assert checkpoints(run)
    assert "classes:\n    - 5" in (run / "config.yaml").read_text()
