"""Whole programs through the TPU compiler: any JAX function (`perfmodel xla`) and a reference transformer step
built from a ModelConfig (`perfmodel predict model --compile`), put on the roofline op by op.

* :mod:`perfmodel.xla.hlo` reads the optimized HLO text (no jax);
* :mod:`perfmodel.xla.program` turns a CompileReport into per-op times, bounds and shares;
* :mod:`perfmodel.xla.reference` is the reference step (jax), :mod:`perfmodel.xla.build` places a program's
  arrays on a slice's mesh (run inside the compile worker);
* :mod:`perfmodel.xla.compare` pairs the compiled step with the analytic one (perfmodel.model.transformer).
"""
