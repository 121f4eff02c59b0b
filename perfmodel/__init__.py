"""perfmodel: how fast an LLM-inference kernel can be on a TPU, how fast it is, and why.

Importing this package is cheap: it does not import jax. Submodules that run or
lower kernels import jax themselves.
"""

__version__ = "0.1.0"


def __getattr__(name: str):
    """Lazy top-level API: ``perfmodel.analyze`` imports the schedule model on first use."""
    if name == "analyze":
        from perfmodel.schedule.analyze import analyze

        return analyze
    raise AttributeError(f"module 'perfmodel' has no attribute {name!r}")
