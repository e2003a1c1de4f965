"""derive_spec across torchvision's classification models with <= 30 M parameters (issue 19).

For every model (weights=None, never downloaded): derive the spec from a 4 x 3 x 64 x 64 batch
(80 x 80 for inception_v3) and run ``check_spec`` (a random permutation of every group leaves
the outputs unchanged). Then time deriving ResNet-50's spec (best of 3; the baseline is one
plain ``torch.fx.symbolic_trace`` + shape propagation, which derive_spec includes).

Then timm's families (``benchmarks/derive_timm.py``: one model per family; needs ``timm``,
``--no-timm`` leaves them out).

Last line: ``torchvision_models=N derived_ok=K fraction=K/N resnet50_derive_s=S
timm_families=M timm_derived_ok=J timm_fraction=J/M``.

    python benchmarks/derive.py [--no-check] [--no-timm]
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

import torch
import torchvision.models as tvm
from torch import fx
from torch.fx.passes.shape_prop import ShapeProp

from lmc.permutation import check_spec, derive_spec

MAX_PARAMS = 30_000_000
KWARGS = {
    "googlenet": {"aux_logits": False, "init_weights": False},
    "inception_v3": {"aux_logits": False, "init_weights": False},
}


def build(name: str) -> torch.nn.Module:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return tvm.get_model(name, weights=None, **KWARGS.get(name, {})).eval()


def n_params(name: str) -> int:
    """Parameter count without initialising the weights (meta device) where the model allows."""
    try:
        with torch.device("meta"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = tvm.get_model(name, weights=None, **KWARGS.get(name, {}))
    except (RuntimeError, NotImplementedError):
        model = build(name)
    return sum(p.numel() for p in model.parameters())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-check", action="store_true", help="derive only, skip check_spec")
    parser.add_argument("--no-timm", action="store_true", help="torchvision only")
    args = parser.parse_args()
    torch.set_num_threads(2)
    ok, total = 0, 0
    for name in tvm.list_models(module=tvm):
        if n_params(name) > MAX_PARAMS:
            continue
        model = build(name)
        total += 1
        size = 80 if name == "inception_v3" else 64
        x = torch.randn(4, 3, size, size, generator=torch.Generator().manual_seed(0))
        t0 = time.perf_counter()
        try:
            spec = derive_spec(model, x)
            dt = time.perf_counter() - t0
            passed = args.no_check or check_spec(model, spec, x, raise_on_failure=False).ok
            status = "ok" if passed else "check_spec FAILED"
            ok += passed
            print(
                f"{name:22s} {status:18s} groups={len(spec.groups):4d} derive={dt:.2f}s", flush=True
            )
        except Exception as e:  # noqa: BLE001 - report and go on
            print(f"{name:22s} FAILED  {type(e).__name__}: {str(e)[:200]}", flush=True)
    model = build("resnet50")
    x = torch.randn(2, 3, 224, 224)
    times, base = [], []
    for _ in range(3):
        t0 = time.perf_counter()
        derive_spec(model, x)
        times.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        with torch.no_grad():
            ShapeProp(fx.symbolic_trace(model)).propagate(x)
        base.append(time.perf_counter() - t0)
    print(
        f"resnet50: derive_spec {min(times):.2f}s, trace+shape propagation {min(base):.2f}s "
        f"({min(times) / min(base):.2f}x)"
    )
    line = (
        f"torchvision_models={total} derived_ok={ok} fraction={ok / total:.3f} "
        f"resnet50_derive_s={min(times):.2f}"
    )
    if not args.no_timm:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from benchmarks.derive_timm import main as timm_main

        t = timm_main()
        line += (
            f" timm_families={t['timm_families']} timm_derived_ok={t['timm_derived_ok']} "
            f"timm_fraction={t['timm_fraction']:.3f}"
        )
    print(line)


if __name__ == "__main__":
    main()
