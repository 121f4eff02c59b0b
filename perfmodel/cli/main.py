"""Entry point. Subcommand modules are imported only when their command runs,
so ``perfmodel hw ...`` and ``perfmodel predict ...`` never import jax."""

from __future__ import annotations

import importlib

import click

import perfmodel

# command name -> "module:attribute" of its click command or group
_COMMANDS = {
    "hw": "perfmodel.cli.hw:hw",
    "predict": "perfmodel.cli.predict:predict",
    "analyze": "perfmodel.cli.analyze:analyze",
    "baseline": "perfmodel.cli.baseline:baseline",
    "cache": "perfmodel.cli.cache:cache",
    "tune": "perfmodel.cli.analyze:tune",
    "inspect": "perfmodel.cli.inspect:inspect_cmd",
    "measure": "perfmodel.cli.measure:measure",
    "compare": "perfmodel.cli.measure:compare",
    "calibrate": "perfmodel.cli.measure:calibrate",
    "report": "perfmodel.cli.report:report",
    "validate": "perfmodel.cli.validate:validate",
    "xla": "perfmodel.cli.xla:xla",
    "serve": "perfmodel.cli.serve:serve",
    "plan": "perfmodel.cli.plan:plan",
    "profile": "perfmodel.cli.profile:profile",
}

_HELP = """How fast can this LLM-inference kernel be on this chip, and why not faster?

\b
Examples:
  perfmodel hw list
  perfmodel hw show v6e
  perfmodel hw compare tpu-v5e tpu-v6e tpu-7x
  perfmodel predict gemm --hw v5e -m 8192 -n 8192 -k 8192
  perfmodel predict model llama-3.1-8b --hw v6e --batch 32 --context 4096
  perfmodel serve llama-3.1-8b --hw v6e --max-concurrency 64 --num-prompts 500
"""


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(_COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        target = _COMMANDS.get(name)
        if target is None:
            return None
        module, attr = target.split(":")
        return getattr(importlib.import_module(module), attr)


@click.group(cls=LazyGroup, help=_HELP, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(perfmodel.__version__, prog_name="perfmodel")
def main() -> None:
    pass


if __name__ == "__main__":
    main()
