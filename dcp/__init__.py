"""dcp: data-centric parallel planning and execution for variable-length training."""

__version__ = "0.1.0"
