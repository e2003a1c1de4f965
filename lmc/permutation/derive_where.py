"""Where a :func:`~lmc.permutation.derive_spec` error happens: the graph node, the module it
runs in and the model's source line (the tracer records stack traces), or for a forward that
``torch.fx`` cannot trace, the module and line where tracing stopped."""

from __future__ import annotations

import linecache
import os
import re
import traceback

from torch import fx, nn


def describe(node: fx.Node) -> str:
    """The node, the module it runs in and its source line (``module 'blocks.0.attn',
    timm/layers/attention.py:120 `q, k, v = qkv.unbind(0)```)."""
    target = (
        node.target
        if isinstance(node.target, str)
        else getattr(node.target, "__name__", node.target)
    )
    out = f"node {node.name!r} ({node.op} {target})"
    stack = node.meta.get("nn_module_stack")
    if stack:
        out += f" in module {next(reversed(stack))!r}"
    where = _source_line(node.stack_trace or "")
    return f"{out} at {where}" if where else out


def _source_line(stack_trace: str) -> str:
    """The innermost frame of a recorded stack outside torch: ``file:line `code```."""
    lines = stack_trace.splitlines()
    found = ""
    for i, line in enumerate(lines):
        m = re.match(r'\s*File "([^"]+)", line (\d+), in', line)
        if m and not _in_torch(m.group(1)):
            code = lines[i + 1].strip() if i + 1 < len(lines) else ""
            found = f"{_short(m.group(1))}:{m.group(2)} `{code}`"
    return found


def _in_torch(path: str) -> bool:
    """A frame of torch's (or of the fallback tracer's, which records through torch.fx)."""
    return (
        f"{os.sep}torch{os.sep}" in path
        or path.startswith("<")
        or path.endswith(f"permutation{os.sep}derive_trace.py")
    )


def _short(path: str) -> str:
    """A source path from its package on (``timm/layers/attention.py``)."""
    parts = path.split(f"{os.sep}site-packages{os.sep}")
    return parts[-1] if len(parts) > 1 else os.path.relpath(path) if os.path.isabs(path) else path


def untraceable_at(model: nn.Module, error: BaseException) -> str:
    """Where tracing stopped: the innermost frame outside torch, and its module's name."""
    names = {id(m): n for n, m in model.named_modules()}
    where = ""
    for frame, lineno in traceback.walk_tb(error.__traceback__):
        path = frame.f_code.co_filename
        if _in_torch(path):
            continue
        line = linecache.getline(path, lineno).strip()
        owner = frame.f_locals.get("self")
        module = names.get(id(owner)) if owner is not None else None
        where = f"{_short(path)}:{lineno} `{line}`"
        if module is not None:
            where = f"module {module or type(model).__name__!r}, {where}"
    return where
