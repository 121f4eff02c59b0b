"""Hardware specs: dataclasses, strict loader and chip registry."""

from perfmodel.hw.registry import all_chips, get_chip, load_spec_file
from perfmodel.hw.spec import ChipSpec

__all__ = ["ChipSpec", "all_chips", "get_chip", "load_spec_file"]
