"""The CuvilError hierarchy: every error a user can meet carries what they need to act."""

SHORT = 40  # characters of a value that a message shows


def short(value, limit: int = SHORT) -> str:
    """A value for a one-line message: its repr cut to `limit` characters, a container
    as its kind and length (never the whole repr of a large value)."""
    if isinstance(value, (dict, list, tuple)):
        n = len(value)
        return f"<{type(value).__name__} of {n} item{'s' if n != 1 else ''}>"
    text = repr(value[:limit + 1] if isinstance(value, (str, bytes)) else value)
    return text if len(text) <= limit else text[:limit] + "..."


class CuvilError(Exception):
    """Base class of all errors Cuvil raises on purpose."""


class VerifyError(CuvilError):
    """The IR breaks an op's rules (bad operand count, shape, dtype or attribute)."""


class ParseError(CuvilError):
    """IR text or a .cvir bundle could not be read; names the line or the field."""


class UnsupportedOpError(CuvilError):
    """A framework op has no Cuvil lowering; names the op and the user's source line."""


class FrontendError(CuvilError):
    """The model could not be captured (export failed, unsupported argument, ...)."""


class BackendError(CuvilError):
    """Code generation failed for an op."""


class LinkError(CuvilError):
    """The C toolchain failed to link an artifact."""
