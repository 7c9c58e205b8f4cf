"""nestgate: the front door of a self-hosted server."""

from pathlib import Path

__version__ = "0.1.0"
# The package's own files (default/: the embedded config and the built-in pages'
# assets; templates/: the notes pages'), wherever the module that reads them lives.
PACKAGE_DIR = Path(__file__).resolve().parent
