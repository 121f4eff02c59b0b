"""`perfmodel cache`: the on-disk caches (compile reports, checked spec loads)."""

from __future__ import annotations

import click

from perfmodel.cli.common import echo_json, echo_text, json_option, user_errors


@click.group(help="The on-disk caches: compile reports ($PERFMODEL_CACHE_DIR/compile, one sub-cache per libtpu "
             "version), checked spec loads ($PERFMODEL_CACHE_DIR/specs) and the test suite's XLA:CPU programs "
             "($PERFMODEL_CACHE_DIR/jax-cpu).")
def cache() -> None:
    pass


@cache.command("info", help="Where the caches are, what they hold and the compile cache's size cap.")
@json_option
@user_errors
def info_cmd(as_json: bool) -> None:
    from perfmodel.compiler import cache as compile_cache
    from perfmodel.compiler.render import render_cache_info

    info = compile_cache.info()
    if as_json:
        echo_json(info)
    else:
        echo_text(render_cache_info(info))


@cache.command("clear", help="Remove every cached compile report, spec load and XLA:CPU program (the next run is cold).")
@json_option
@user_errors
def clear_cmd(as_json: bool) -> None:
    from perfmodel.compiler import cache as compile_cache
    from perfmodel.compiler.render import render_cache_info

    removed = compile_cache.clear()
    if as_json:
        echo_json(removed)
    else:
        echo_text(render_cache_info(removed, cleared=True))
