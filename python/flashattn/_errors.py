"""Exceptions raised by flashattn. Every one is a flashattn.Error carrying the C library's
fa_status (``status``) and, as its message, fa_last_error()'s one-line text."""


class Error(Exception):
    """A flashattn failure; ``status`` is the C API's fa_status number."""

    #: fa_status names, by number (include/flashattn.h).
    STATUS_NAMES = {
        0: "FA_SUCCESS",
        1: "FA_ERROR_INVALID_VALUE",
        2: "FA_ERROR_NOT_SUPPORTED",
        3: "FA_ERROR_OUT_OF_MEMORY",
        4: "FA_ERROR_BACKEND_UNAVAILABLE",
        5: "FA_ERROR_BACKEND_FAILURE",
    }

    def __init__(self, message, status=5):
        super().__init__(message)
        self.message = message
        self.status = int(status)

    @property
    def status_name(self):
        return self.STATUS_NAMES.get(self.status, "unknown status %d" % self.status)

    def __str__(self):
        return self.message


class InvalidValueError(Error, ValueError):
    """FA_ERROR_INVALID_VALUE: an argument's value (shape, stride, option) is wrong."""


class InvalidTypeError(Error, TypeError):
    """FA_ERROR_INVALID_VALUE for an argument of the wrong kind: not a DLPack tensor, wrong dtype."""


class NotSupportedError(Error, NotImplementedError):
    """FA_ERROR_NOT_SUPPORTED: the backend cannot do what was asked."""


class OutOfMemoryError(Error, MemoryError):
    """FA_ERROR_OUT_OF_MEMORY."""


class BackendUnavailableError(Error, RuntimeError):
    """FA_ERROR_BACKEND_UNAVAILABLE: the backend is not built, its runtime is missing or it sees no device."""


class BackendFailureError(Error, RuntimeError):
    """FA_ERROR_BACKEND_FAILURE: a GPU runtime call failed."""
