"""The fallback tracer of :func:`~lmc.permutation.derive_spec` (issue 35 item 5): ``torch.fx``
with the values of the example input alongside.

``torch.fx`` traces with symbolic proxies, so a forward that branches on a shape (``if H !=
window:``), takes ``len`` of one or turns it into a Python number (``int(math.sqrt(T))``) stops
it. This tracer runs every recorded operation on the example input too, and a proxy answers
``shape``, ``size()``, ``dim()``, ``len``, ``int``, ``bool`` and iteration with those concrete
values: the forward traces as the example runs it (the branch its shapes take; shapes become
constants of the graph), which is what a derivation for that input size needs. A branch on a
tensor's *values* is still refused (the spec would hold for the example's branch alone). It runs
the model once more, in eval mode and without gradients, and leaves it unchanged.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, fx, nn

_CONCRETE_ATTRIBUTES = {"shape", "ndim", "dtype", "device", "is_cuda", "requires_grad", "layout"}


class ConcreteProxy(fx.Proxy):
    """A proxy holding the value it takes on the example input (``value``)."""

    def __init__(self, node: fx.Node, tracer: ConcreteTracer, value: Any = None) -> None:
        super().__init__(node, tracer)
        self.value = value

    def __getattr__(self, name: str) -> Any:
        if name in _CONCRETE_ATTRIBUTES and isinstance(self.value, Tensor):
            return getattr(self.value, name)
        return super().__getattr__(name)

    def size(self, dim: int | None = None) -> Any:
        return self.value.size() if dim is None else self.value.size(dim)

    def dim(self) -> int:
        return self.value.dim()

    def numel(self) -> int:
        return self.value.numel()

    def __len__(self) -> int:
        return len(self.value)

    def _number(self) -> Any:
        """The value as a Python number, unless it is a tensor's value: a branch on values
        would give a spec of the example's branch alone, so it stays refused."""
        if isinstance(self.value, Tensor):
            raise fx.proxy.TraceError(
                "control flow on a tensor's value (not its shape): the spec would hold for the "
                "example input's branch only"
            )
        return self.value

    def __bool__(self) -> bool:
        return bool(self._number())

    def __int__(self) -> int:
        return int(self._number())

    def __float__(self) -> float:
        return float(self._number())

    def __index__(self) -> int:
        return int(self._number())

    if TYPE_CHECKING:  # fx.Proxy's operators are set on it at import, unseen by mypy

        def __getitem__(self, key: Any) -> Any: ...

    def __iter__(self) -> Iterator[Any]:
        return iter([self[i] for i in range(len(self.value))])


class ConcreteTracer(fx.Tracer):
    """``torch.fx``'s tracer computing each node's value on ``inputs`` as it records it."""

    def __init__(self, inputs: tuple[Any, ...], leaf: Any = None) -> None:
        super().__init__()
        self.inputs = list(inputs)
        self.leaf = leaf  # module -> bool: modules kept whole besides torch's own

    real = False  # computing a value: modules run as they are (fx patches calls, attributes)

    def call_module(self, m: nn.Module, forward: Any, args: Any, kwargs: Any) -> Any:
        if self.real:
            return forward(*args, **kwargs)
        return super().call_module(m, forward, args, kwargs)

    def getattr(self, attr: str, attr_val: Any, parameter_proxy_cache: dict) -> Any:
        if self.real:  # a parameter read while a module runs for its value: the tensor
            return attr_val
        return super().getattr(attr, attr_val, parameter_proxy_cache)

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        if self.leaf is not None and self.leaf(m):
            return True
        return super().is_leaf_module(m, module_qualified_name)

    def create_proxy(
        self, kind, target, args, kwargs, name=None, type_expr=None, proxy_factory_fn=None
    ):
        proxy = super().create_proxy(
            kind, target, args, kwargs, name, type_expr, lambda node: ConcreteProxy(node, self)
        )
        self.real = True
        try:
            proxy.value = self._value(kind, target, args, kwargs)
        finally:
            self.real = False
        return proxy

    def _value(self, kind: str, target: Any, args: Any, kwargs: Any) -> Any:
        real = fx.node.map_aggregate(
            (args, kwargs), lambda a: a.value if isinstance(a, ConcreteProxy) else a
        )
        args, kwargs = real
        if kind == "placeholder":
            return self.inputs.pop(0) if self.inputs else None
        if kind == "get_attr":
            value: Any = self.root
            for part in str(target).split("."):
                value = getattr(value, part)
            return value
        if kind == "call_function":
            return target(*args, **kwargs)
        if kind == "call_method":
            return getattr(args[0], target)(*args[1:], **kwargs)
        if kind == "call_module":
            return self.root.get_submodule(target)(*args, **kwargs)
        return None


def trace_concrete(model: nn.Module, inputs: tuple[Any, ...], leaf: Any = None) -> fx.Graph:
    """The graph of ``model`` run on ``inputs`` (eval mode, no gradients), branches and shapes
    taken from them; ``leaf(module)`` keeps a module whole."""
    was = model.training
    model.eval()
    try:
        with torch.no_grad():
            tracer = ConcreteTracer(inputs, leaf)
            tracer.record_stack_traces = True
            return tracer.trace(model)
    finally:
        model.train(was)


def trace_for_derivation(
    model: nn.Module, inputs: tuple[Any, ...], tracer: type[fx.Tracer], leaf: Any
) -> tuple[fx.GraphModule | None, Exception | None]:
    """``model``'s graph module by ``tracer`` (torch.fx's symbolic tracing, errors naming the
    model's source lines), else by :func:`trace_concrete` on ``inputs``: ``(graph module,
    None)``, or ``(None, the symbolic tracer's error)`` when neither traces."""
    name = type(model).__name__
    try:
        symbolic = tracer()
        symbolic.record_stack_traces = True
        graph = symbolic.trace(model)
        return fx.GraphModule(symbolic.root, graph, name), None
    except Exception as e:  # noqa: BLE001 - any tracing failure: the fallback, then reported
        try:
            return fx.GraphModule(model, trace_concrete(model, inputs, leaf), name), None
        except Exception:  # noqa: BLE001 - the symbolic tracer's error says more
            return None, e
