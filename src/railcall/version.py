"""railcall's version, on the ground floor: the server and the command line report it without
importing the package's public surface."""

__version__ = "0.1.0"
