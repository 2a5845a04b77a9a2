"""The CuvilError hierarchy: every error a user can meet carries what they need to act."""


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
