"""Measurement harness: run a bundled kernel, keep the timing next to perfmodel's predictions.

* :mod:`.records`: the JSON Lines results format (one self-describing record per
  measurement), its crash-safe writer and its reader;
* :mod:`.measure`: timing a catalog kernel on the JAX backend that is present
  (compiled on a TPU, Pallas TPU interpret mode elsewhere) and predicting it
  with the schedule model; also turns published measurements into records;
* :mod:`.calibrate`: fitting the expected-time model's achievable-efficiency
  factors from real-backend records;
* :mod:`.plots` and :mod:`.report`: pure functions from records (or a
  ``predict model`` step) to figures and text.

Importing this package imports neither jax nor matplotlib.
"""
