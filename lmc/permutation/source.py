"""Where a task's permutation spec comes from, as one config string (``spec:`` in YAML).

* ``auto`` (default): the hand-written spec of a built-in network, else derived with
  ``torch.fx`` from an example input (so a user's own ``nn.Module`` works from YAML);
* ``builtin``: the hand-written spec only (an error for other networks);
* ``derive``: :func:`~lmc.permutation.derive_spec` from an example input, also for built-ins;
* ``package.module:function``: a user function ``function(net) -> PermutationSpec``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from torch import Tensor, nn

from lmc.permutation.builtin import has_builtin_spec, spec_for
from lmc.permutation.derive import derive_spec
from lmc.permutation.spec import PermutationSpec

SPEC_SOURCES = ("auto", "builtin", "derive", "package.module:function")
ExampleInput = Tensor | Callable[[], Tensor] | None


def needs_example(source: str, net: nn.Module) -> bool:
    """Whether resolving ``source`` for ``net`` needs an example input (a derived spec)."""
    return source == "derive" or (source == "auto" and not has_builtin_spec(net))


def check_spec_source(source: str, field: str = "spec") -> str:
    """``source`` if it is one of :data:`SPEC_SOURCES`' forms, else a ``ValueError``."""
    if source in ("auto", "builtin", "derive"):
        return source
    module, sep, name = source.partition(":")
    if sep and module and name.isidentifier():
        return source
    raise ValueError(
        f"{field}={source!r} is not a spec source; use auto, builtin, derive or "
        "'package.module:function' (a function net -> PermutationSpec)"
    )


def resolve_spec(
    source: str, net: nn.Module, example_input: ExampleInput = None
) -> PermutationSpec:
    """The permutation spec of ``net`` from ``source`` (see the module docstring).

    Args:
        source: ``auto``, ``builtin``, ``derive`` or ``package.module:function``.
        net: the network the spec describes.
        example_input: a batch of inputs, or a function returning one (called only when a spec
            is derived), to propagate shapes through ``torch.fx``.

    Raises:
        ValueError: a malformed source, a derived spec without an example input, or a
            function that does not return a ``PermutationSpec``.
        TypeError: ``builtin`` for a network without a hand-written spec.
        SpecDerivationError: the network cannot be traced or has an unsupported operation.
    """
    check_spec_source(source)
    if source == "builtin":
        if not has_builtin_spec(net):
            raise TypeError(
                f"spec='builtin' but there is no built-in permutation spec for "
                f"{type(net).__name__}; use spec: auto (derived with torch.fx from the data) or "
                "'package.module:function'"
            )
        return spec_for(net)
    if needs_example(source, net):
        if example_input is None:
            raise ValueError(
                f"spec={source!r} derives the permutation spec of {type(net).__name__} with "
                "torch.fx and needs an example input: run it with a data module, or set spec "
                "to 'package.module:function' returning a PermutationSpec"
            )
        x = example_input() if callable(example_input) else example_input
        return derive_spec(net, x)
    if source == "auto":
        return spec_for(net)
    module, _, name = source.partition(":")
    try:
        fn = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"spec={source!r}: cannot import {name} from {module} ({err})") from None
    spec = fn(net)
    if not isinstance(spec, PermutationSpec):
        raise ValueError(f"spec={source!r} returned {type(spec).__name__}, not a PermutationSpec")
    return spec
