"""perfmodel: how fast an LLM-inference kernel can be on a TPU, how fast it is, and why.

Importing this package is cheap: it does not import jax. Submodules that run or
lower kernels import jax themselves.
"""

__version__ = "0.1.0"
