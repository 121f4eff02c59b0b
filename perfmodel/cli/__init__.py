"""The ``perfmodel`` command line: thin click wrappers over the library.

The command line does no large matrix products on the host, so it starts numpy's OpenBLAS with one thread
(its thread pool costs 50-80 ms at import on two cores); a user's own OPENBLAS_NUM_THREADS wins. The library
leaves the setting alone.
"""

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
