"""What `perfmodel predict` computes, as library functions that return typed results (no jax).

* :mod:`~perfmodel.predict.sweep`: an op over chips x sweep points (:class:`OpSweep`);
* :mod:`~perfmodel.predict.ops`: the op of each ``predict`` command, built from flat keyword parameters;
* :mod:`~perfmodel.predict.capacity`: KV-cache capacity over chips x sweep points;
* :mod:`~perfmodel.predict.steps`: one prefill or decode step of a whole model over chips x sweep points;
* :mod:`~perfmodel.predict.render` and :mod:`~perfmodel.predict.step_render`: their text, CSV and JSON.

The CLI (:mod:`perfmodel.cli.predict`) parses options, calls these and prints what the renderers return.
"""
