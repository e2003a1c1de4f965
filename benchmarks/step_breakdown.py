"""Where a training step of ``lmc fit`` spends its time (issue 30): the MNIST MLP's step under
variants that each take one more piece away, against the plain device-resident loop, in one
process on one device, so that the differences are the pieces' costs.

``lmc`` variants (``configs/mnist/mlp.yaml``, device-resident data, no validation, progress bar
off; median epoch after the first, per step):

* ``automatic``: the task's step run by Lightning's automatic optimization loop (closure,
  optimizer wrapper, hooks): what ``lmc fit`` ran before the lean step;
* ``lean``: ``lmc fit`` as it runs (the task steps its optimizer itself; with no hook to
  dispatch, by ``loss.backward()`` and the torch optimizer directly: ``lmc/tasks/direct.py``);
* ``lean_raw``: the lean step's arithmetic alone, ``loss.backward()`` and the torch optimizer
  (diagnostic only: Lightning's step count stays 0);
* ``lean_raw_nometric``: that, without the epoch loss and accuracy updates (diagnostic only);
* ``captured`` (CUDA): ``configs/speed/capture.yaml``.

``plain`` variants: the device-resident loop of ``benchmarks/training.py`` (``eager``), with
Adam's fused kernel (``fused``), and replayed as one CUDA graph per step (``graph``, CUDA).

Run ``python benchmarks/step_breakdown.py [cpu|gpu] [width]`` (MNIST from ``$LMC_DATA_DIR``;
default gpu, width 512). The last line holds ``<kind>_<variant>_us=<microseconds a step>`` and
the device.
"""

import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from torch import nn  # noqa: E402

from benchmarks.training import EpochTimer, _cli, as_automatic  # noqa: E402

ACC = sys.argv[1] if len(sys.argv) > 1 else "gpu"
WIDTH = sys.argv[2] if len(sys.argv) > 2 else "512"
EPOCHS = 4


def base(extra=()):
    tmp = tempfile.mkdtemp()
    return _cli(
        ["-c", "configs/mnist/mlp.yaml", "-c", "configs/loggers/csv.yaml"]
        + [f"--model.init_args.net.init_args.width={WIDTH}", f"--trainer.accelerator={ACC}"]
        + [f"--trainer.max_epochs={EPOCHS}", "--trainer.limit_val_batches=0"]
        + ["--trainer.num_sanity_val_steps=0", "--trainer.enable_progress_bar=false"]
        + ["--trainer.enable_model_summary=false", f"--trainer.default_root_dir={tmp}", *extra]
    )


def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def lmc(mode):
    cli = base(["--model.init_args.capture_step=true"] if mode == "captured" else [])
    task = cli.model
    if mode == "automatic":
        as_automatic(task)
    elif "raw" in mode:

        def training_step(batch, batch_idx, task=task):
            opt = task.optimizers().optimizer
            opt.zero_grad()
            if "nometric" in mode:
                loss = nn.functional.cross_entropy(task(batch[0]), batch[1])
            else:
                loss = task._shared_step(batch, "train")
            loss.backward()
            opt.step()

        task.training_step = training_step
    timer = EpochTimer()
    cli.trainer.callbacks.append(timer)
    cli.trainer.fit(task, datamodule=cli.datamodule)
    return statistics.median(timer.times[1:]), cli.datamodule


def plain(mode):
    cli = base()
    task, dm = cli.model, cli.datamodule
    dm.prepare_data()
    dm.setup("fit")
    device = torch.device("cuda" if ACC == "gpu" else "cpu")
    ds = dm.train_dataset
    n = len(ds)
    x_all, y_all = ds.to(device).batch(torch.arange(n, device=device))
    net = task.net.to(device)
    kw = {"fused": True} if mode == "fused" else {"capturable": True} if mode == "graph" else {}
    opt = torch.optim.Adam(net.parameters(), lr=1e-3, **kw)
    loss_fn = nn.CrossEntropyLoss()
    gen = torch.Generator(device=device).manual_seed(0)
    bs = dm.batch_size
    graph = None
    if mode == "graph":
        sx, sy = x_all[:bs].clone(), y_all[:bs].clone()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                opt.zero_grad(set_to_none=True)
                loss_fn(net(sx), sy).backward()
                opt.step()
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        opt.zero_grad(set_to_none=True)
        with torch.cuda.graph(graph):
            sout = net(sx)
            sloss = loss_fn(sout, sy)
            sloss.backward()
            opt.step()
    times = []
    for _ in range(EPOCHS):
        sync()
        t0 = time.perf_counter()
        for idx in torch.randperm(n, device=device, generator=gen).split(bs):
            if graph is not None and len(idx) == bs:
                sx.copy_(x_all[idx])
                sy.copy_(y_all[idx])
                graph.replay()
                continue
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(net(x_all[idx]), y_all[idx])
            loss.backward()
            opt.step()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:]), dm


modes = [("plain", m) for m in ("eager", "fused")] + [
    ("lmc", m) for m in ("automatic", "lean", "lean_raw", "lean_raw_nometric")
]
if ACC == "gpu":
    modes += [("plain", "graph"), ("lmc", "captured")]
out = {}
for kind, mode in modes:
    t, dm = (plain if kind == "plain" else lmc)(mode)
    steps = -(-len(dm.train_dataset) // dm.batch_size)
    out[f"{kind}_{mode}_us"] = 1e6 * t / steps
    print(f"{kind} {mode}: {1e6 * t / steps:.0f} us a step", flush=True)
device = torch.cuda.get_device_name() if ACC == "gpu" else "cpu"
print(
    f"device={device.replace(' ', '_')} width={WIDTH} "
    + " ".join(f"{k}={v:.0f}" for k, v in out.items())
)
