"""railcall: grammar-constrained tool calling.

The set of valid calls is compiled, from the live tool table, into a grammar enforced over the
model's tokens: every token that would break the call is masked before sampling, so a malformed
or forbidden call is unreachable rather than rejected. The grammar guarantees the syntax; the
model supplies the semantics.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
