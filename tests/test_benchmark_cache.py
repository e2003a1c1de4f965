"""The benchmarks' endpoint cache is keyed by the resolved training config and the code version,
and benchmarks that need a dataset stop without it (benchmarks/_endpoints.py)."""

from __future__ import annotations

import copy
import os

import pytest

from benchmarks._endpoints import (
    MNIST_FILES,
    ROOT,
    cache_key,
    code_version,
    require_data,
    training_config,
)

CONFIG = {  # the shape of a resolved `lmc fit` config, cut down
    "seed_everything": 0,
    "trainer": {"max_epochs": 3, "accelerator": "auto", "max_steps": -1},
    "model": {
        "class_path": "lmc.tasks.ClassificationTask",
        "init_args": {
            "net": {
                "class_path": "lmc.models.MLP",
                "init_args": {"in_features": 784, "width": 512, "depth": 3},
            },
            "optimizer": {
                "class_path": "torch.optim.Adam",
                "init_args": {"lr": 0.001, "betas": [0.9, 0.999]},
            },
        },
    },
    "data": {"class_path": "lmc.data.MNISTDataModule", "init_args": {"limit_train": None}},
}


def _changed(path: tuple, value) -> dict:
    out = copy.deepcopy(CONFIG)
    node = out
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return out


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("seed_everything",), 1),
        (("trainer", "max_epochs"), 4),
        (("model", "init_args", "net", "class_path"), "lmc.models.VGG"),
        (("model", "init_args", "net", "init_args", "width"), 256),
        (("model", "init_args", "optimizer", "class_path"), "torch.optim.SGD"),
        (("model", "init_args", "optimizer", "init_args", "lr"), 0.01),
        (("model", "init_args", "optimizer", "init_args", "betas"), [0.9, 0.99]),
        (("data", "init_args", "limit_train"), 12000),
    ],
)
def test_cache_key_changes_with_every_training_argument(path, value):
    code = "a" * 64
    assert cache_key(_changed(path, value), code) != cache_key(CONFIG, code)


def test_cache_key_is_equal_for_equal_config_and_code_and_changes_with_the_code():
    code = "a" * 64
    key = cache_key(CONFIG, code)
    assert len(key) == 64 and key == cache_key(copy.deepcopy(CONFIG), code)
    reordered = dict(reversed(list(copy.deepcopy(CONFIG).items())))  # key order is not content
    assert cache_key(reordered, code) == key
    assert cache_key(CONFIG, "b" * 64) != key


def _tree(root, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


def test_code_version_follows_the_contents_of_the_sources(tmp_path):
    _tree(tmp_path, {"lmc/a.py": "x = 1\n", "lmc/sub/b.py": "y = 2\n", "callbacks/c.py": "z = 3\n"})
    base = code_version(tmp_path)
    # equal contents, equal version: rewritten with the same bytes, touched, caches and data
    (tmp_path / "lmc" / "a.py").write_text("x = 1\n")
    os.utime(tmp_path / "lmc" / "sub" / "b.py", (1, 1))
    _tree(tmp_path, {"lmc/__pycache__/a.cpython-312.py": "junk", "lmc/notes.txt": "not code"})
    assert code_version(tmp_path) == base
    # any change of a source's content, name or the set of sources is a new version
    for change in (
        {"lmc/a.py": "x = 2\n"},
        {"callbacks/c.py": "z = 4\n"},
        {"lmc/sub/new.py": ""},
    ):
        _tree(tmp_path, change)
        assert code_version(tmp_path) != base
        base = code_version(tmp_path)
    (tmp_path / "lmc" / "sub" / "new.py").rename(tmp_path / "lmc" / "sub" / "renamed.py")
    assert code_version(tmp_path) != base
    # the real sources
    assert code_version() == code_version(ROOT)


def test_training_config_is_the_resolved_cli_config():
    """Resolved by `lmc fit --print_config`: defaults filled in, overrides applied, logging out."""
    config = ROOT / "configs" / "mnist" / "mlp.yaml"
    base = training_config(config, 0, ["--trainer.max_epochs=3"])
    adam = base["model"]["init_args"]["optimizer"]["init_args"]
    assert adam["lr"] == 0.001 and adam["betas"] == [0.9, 0.999]  # a default filled in
    assert base["trainer"]["max_epochs"] == 3 and base["seed_everything"] == 0
    assert "logger" not in base["trainer"] and "test_after_fit" not in base
    code = code_version()
    key = cache_key(base, code)
    # an override that restates the config's own value resolves to the same config
    same = training_config(
        config, 0, ["--trainer.max_epochs=3", "--model.init_args.net.init_args.width=512"]
    )
    assert cache_key(same, code) == key
    for seed, extra in ((1, []), (0, ["--model.init_args.net.init_args.width=256"])):
        assert (
            cache_key(training_config(config, seed, ["--trainer.max_epochs=3", *extra]), code)
            != key
        )
    assert cache_key(training_config(config, 0, ["--trainer.max_epochs=4"]), code) != key


def test_require_data_stops_with_the_expected_files(tmp_path, monkeypatch):
    monkeypatch.delenv("LMC_DATA_DIR", raising=False)
    with pytest.raises(SystemExit) as err:
        require_data("MNIST", "bench.py")
    assert "LMC_DATA_DIR is not set" in str(err.value.code)
    monkeypatch.setenv("LMC_DATA_DIR", str(tmp_path))
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    (raw / f"{MNIST_FILES[0]}.gz").write_bytes(b"")
    with pytest.raises(SystemExit) as err:
        require_data("MNIST", "bench.py")
    message = str(err.value.code)  # a string: Python prints it and exits with status 1
    assert "bench.py needs MNIST" in message and "LMC_DATA_DIR" in message
    assert all(f"{raw / f}.gz" in message for f in MNIST_FILES)  # the layout expected
    missing = message.split("missing ")[1].split(" in ")[0]
    assert missing == ", ".join(MNIST_FILES[1:])
    for name in MNIST_FILES[1:]:
        (raw / name).write_bytes(b"")  # decompressed files count too
    assert require_data("MNIST", "bench.py") == raw


def test_weight_matching_benchmark_stops_without_mnist_unless_untrained(tmp_path, monkeypatch):
    from benchmarks import weight_matching

    monkeypatch.setenv("LMC_DATA_DIR", str(tmp_path))
    monkeypatch.setattr(weight_matching, "CACHE", tmp_path / "cache")  # no cached models
    with pytest.raises(SystemExit) as err:
        weight_matching.main(["--quick"])
    assert "LMC_DATA_DIR" in str(err.value.code) and "train-images-idx3-ubyte" in str(
        err.value.code
    )
    a, b, note = weight_matching.mnist_mlp_pair(untrained=True)  # no data read
    assert note.startswith("UNTRAINED") and not (tmp_path / "cache").exists()


def test_the_lap_concurrency_comparison_finds_the_same_permutations(tmp_path, capsys):
    """``--compare-lap-cells``: the trained VGG's cold call with LAPs one at a time (at most 1
    entry at once) finds the permutations of the default batching (it follows the one-by-one
    trajectory), and the module's cap is restored afterwards."""
    import importlib

    from benchmarks import weight_matching

    module = importlib.import_module("lmc.permutation.weight_matching")
    cap = module.CONCURRENT_LAP_CELLS
    args = ["--quick", "--only-trained", "--calls", "1", "--vgg-calls", "0"]
    weight_matching.main(
        args + ["--train-images", "16", "--train-epochs", "1"] + ["--compare-lap-cells", "1"]
    )
    out = capsys.readouterr().out
    line = next(s for s in out.splitlines() if "info: cold call with LAPs" in s)
    assert f"at most {cap} entries at once (the default)" in line and "at most 1:" in line
    assert line.endswith("same permutations: True")
    assert module.CONCURRENT_LAP_CELLS == cap
