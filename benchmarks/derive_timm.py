"""derive_spec across timm's model families (issue 35): one model per family (timm's module of
the model), the first in sorted order with <= 30 M parameters at ``num_classes=10`` (counted on
the meta device), ``pretrained=False`` (nothing downloaded), its default input size, batch 2:
derive the spec, then ``check_spec``. The rule picks the representative before anything is
measured; a family none of whose models is small enough is left out.

    python benchmarks/derive_timm.py            # prints one line per family, then the figures

Last line: ``timm_families=N timm_derived_ok=K timm_fraction=K/N``.
"""

from __future__ import annotations

import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from lmc.permutation import check_spec, derive_spec  # noqa: E402

MAX_PARAMS = 30_000_000


def representatives() -> dict[str, str]:
    """Family (timm module) -> its representative model name."""
    import timm
    from timm.models._registry import _model_to_module

    families: dict[str, list[str]] = {}
    for name in timm.list_models():
        families.setdefault(_model_to_module.get(name, "?"), []).append(name)
    out = {}
    for family in sorted(families):
        for name in sorted(families[family]):
            try:
                with torch.device("meta"), warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    model = timm.create_model(name, pretrained=False, num_classes=10)
            except Exception:  # noqa: BLE001 - a model that cannot be built: the next one
                continue
            if sum(p.numel() for p in model.parameters()) <= MAX_PARAMS:
                out[family] = name
                break
    return out


def derive_one(name: str) -> str:
    """``"ok"``, or why ``name`` does not derive or check."""
    import timm

    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = timm.create_model(name, pretrained=False, num_classes=10).eval()
    x = torch.randn(2, *model.pretrained_cfg.get("input_size", (3, 224, 224)))
    try:
        spec = derive_spec(model, x)
        result = check_spec(model, spec, x, raise_on_failure=False)
    except Exception as e:  # noqa: BLE001 - reported per family
        return f"{type(e).__name__}: {str(e).splitlines()[0][:220]}"
    return "ok" if result.ok else "check_spec FAILED"


def main() -> dict[str, float]:
    torch.set_num_threads(2)
    picks = representatives()
    ok = 0
    for family, name in picks.items():
        t0 = time.perf_counter()
        status = derive_one(name)
        ok += status == "ok"
        print(f"{family:22s} {name:34s} {status}  ({time.perf_counter() - t0:.1f} s)", flush=True)
    figures = {"timm_families": len(picks), "timm_derived_ok": ok, "timm_fraction": ok / len(picks)}
    print(
        " ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in figures.items())
    )
    return figures


if __name__ == "__main__":
    main()
