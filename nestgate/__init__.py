"""nestgate: the front door of a self-hosted server."""

__version__ = "0.1.0"
