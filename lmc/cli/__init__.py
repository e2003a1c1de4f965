"""The ``lmc`` command line: argv to the engine or the studies.

``lmc fit|validate|test|predict`` runs :func:`lmc.engine.main` (LightningCLI); ``lmc study``
plans and runs studies (:mod:`lmc.cli.study`) and starts its workers before Lightning is
imported here. ``LMCCLI``, ``cli_kwargs``, ``build_cli`` and ``moved_keys_error``, which live in
:mod:`lmc.engine`, stay importable from ``lmc.cli``; they are loaded on first use.
"""

from __future__ import annotations

import difflib
import sys
from typing import Any

#: the commands, each with its line in ``lmc --help`` (the first four are LightningCLI's)
COMMANDS = {
    "fit": "train a model from a YAML config (a run folder with its config and checkpoints)",
    "validate": "evaluate a run or a task: barriers, matching, merges, curves",
    "test": "test a trained run on its test split",
    "predict": "predictions of a trained run",
    "study": "plan, run, follow and report a study file (a grid of runs, then evaluations)",
    "configs": "list or copy the shipped configs: lmc configs list | copy NAME [DEST]",
    "completion": "print a shell completion script: lmc completion bash|zsh",
}
STUDY_COMMANDS = ("plan", "run", "status", "report", "claims")

HELP = """usage: lmc <command> [options]

Linear mode connectivity research: train, align, interpolate, merge, prune and measure
models, each run one YAML config, each study one YAML file.

commands:
{commands}

`lmc <command> --help` lists a command's options; `lmc fit --config lmc:quickstart` trains
two small models and measures the barrier between them (`lmc:NAME` is a shipped config:
`lmc configs list`). Rerun any run with `lmc fit --config <run folder>/config.yaml`.
"""

COMPLETION_BASH = """# lmc completion for bash: eval "$(lmc completion bash)" (e.g. in ~/.bashrc)
_lmc() {{
  local cur="${{COMP_WORDS[COMP_CWORD]}}"
  if [ "$COMP_CWORD" -eq 1 ]; then
    COMPREPLY=($(compgen -W "{commands}" -- "$cur"))
    return
  fi
  case "${{COMP_WORDS[1]}}" in
    study)
      if [ "$COMP_CWORD" -eq 2 ]; then
        COMPREPLY=($(compgen -W "{study}" -- "$cur"))
        return
      fi ;;
    completion)
      COMPREPLY=($(compgen -W "bash zsh" -- "$cur"))
      return ;;
    configs)
      COMPREPLY=($(compgen -W "list copy" -- "$cur"))
      return ;;
    fit|validate|test|predict)
      if [[ "$cur" == -* ]]; then
        COMPREPLY=($(compgen -W "{options}" -- "$cur"))
        return
      fi ;;
  esac
  COMPREPLY=($(compgen -f -- "$cur"))
}}
complete -o filenames -o bashdefault -F _lmc lmc
"""

#: the options offered after ``lmc fit|validate|test|predict -`` (the rest: ``--help``)
RUN_OPTIONS = (
    "--config",
    "--help",
    "--print_config",
    "--ckpt_path",
    "--seed_everything",
    "--spawn_from",
    "--population",
    "--trainer.",
    "--model.",
    "--data.",
)


def completion_script(shell: str) -> str:
    """The completion script of ``shell`` (``bash``; ``zsh`` runs it through bashcompinit)."""
    if shell not in ("bash", "zsh"):
        raise ValueError(f"lmc completion: give bash or zsh, got {shell!r}")
    script = COMPLETION_BASH.format(
        commands=" ".join(COMMANDS), study=" ".join(STUDY_COMMANDS), options=" ".join(RUN_OPTIONS)
    )
    if shell == "zsh":
        script = (
            '# lmc completion for zsh: eval "$(lmc completion zsh)" (e.g. in ~/.zshrc)\n'
            "autoload -U +X bashcompinit && bashcompinit\n" + script
        )
    return script


def _front_door(argv: list[str]) -> int | None:
    """What ``lmc`` answers without Lightning: its help, the completion scripts, a mistyped
    command (with the nearest ones); ``None`` when the command is to run."""
    if not argv or argv[0] in ("-h", "--help", "help"):
        width = max(map(len, COMMANDS))
        lines = "\n".join(f"  {name:<{width}}  {line}" for name, line in COMMANDS.items())
        sys.stdout.write(HELP.format(commands=lines))
        return 0 if argv else 2
    first = argv[0]
    if first == "configs":
        return _configs(argv[1:])
    if first == "completion":
        if len(argv) != 2 or argv[1] not in ("bash", "zsh"):
            sys.stderr.write("lmc: error: usage: lmc completion bash|zsh\n")
            return 2
        sys.stdout.write(completion_script(argv[1]))
        return 0
    if first.startswith("-") or first in COMMANDS:
        return None  # LightningCLI's own options before the command, or a command
    near = difflib.get_close_matches(first, list(COMMANDS), n=2, cutoff=0.5)
    hint = f"; did you mean {' or '.join(repr(n) for n in near)}?" if near else ""
    sys.stderr.write(
        f"lmc: error: unknown command {first!r}{hint} (commands: {', '.join(COMMANDS)}; "
        "lmc --help says what each does)\n"
    )
    return 2


def _configs(argv: list[str]) -> int:
    """``lmc configs list`` and ``lmc configs copy NAME [DEST]`` (:mod:`lmc.shipped`)."""
    from lmc.shipped import copy_shipped, shipped_configs

    if argv == ["list"]:
        sys.stdout.write("\n".join(f"lmc:{name}" for name in shipped_configs()) + "\n")
        return 0
    if argv[:1] == ["copy"] and len(argv) in (2, 3):
        try:
            written = copy_shipped(argv[1], argv[2] if len(argv) == 3 else None)
        except (ValueError, FileExistsError) as err:
            sys.stderr.write(f"lmc: error: {err}\n")
            return 2
        sys.stdout.write(f"wrote {written}\n")
        return 0
    sys.stderr.write("lmc: error: usage: lmc configs list | lmc configs copy NAME [DEST]\n")
    return 2


def main(args: list[str] | None = None) -> None:
    """Entry point of the ``lmc`` console script; ``args`` lets tests call it in-process."""
    from lmc.registry import load_plugins

    argv = sys.argv[1:] if args is None else list(args)
    answered = _front_door(argv)
    if answered is not None:
        raise SystemExit(answered)
    try:
        load_plugins()  # the user's registered matchers and merge methods ($LMC_PLUGINS)
    except ImportError as err:
        if args is not None:
            raise
        sys.stderr.write(f"lmc: error: {err}\n")
        raise SystemExit(1) from None
    if argv[:1] == ["study"]:  # lmc study plan|run|status|report|claims
        from lmc.cli.study import study_main

        return study_main(argv[1:], raise_errors=args is not None)
    from lmc.engine.app import main as run

    run(args)


def __getattr__(name: str) -> Any:
    import lmc.engine

    try:
        return getattr(lmc.engine, name)
    except AttributeError:
        raise AttributeError(f"module 'lmc.cli' has no attribute {name!r}") from None
