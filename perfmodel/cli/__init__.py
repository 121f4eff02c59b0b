"""The ``perfmodel`` command line: thin click wrappers over the library."""
