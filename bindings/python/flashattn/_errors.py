"""flashattn.Error and one subclass per fa_status code."""

from . import _lib


class Error(Exception):
    """A failed flashattn call. .status is the fa_status code (int),
    .status_name its enum name, .message the detailed fa_last_error() text
    (or the binding's own message for checks done in Python)."""

    status = None

    def __init__(self, status, message):
        self.status = int(status)
        self.status_name = _lib.STATUS_NAMES.get(self.status, "FA_STATUS_%d" % self.status)
        self.message = message
        super().__init__("%s (%s)" % (message, self.status_name))


class InvalidArgumentError(Error, ValueError):
    pass


class UnsupportedError(Error):
    pass


class OutOfMemoryError(Error, MemoryError):
    pass


class NoDriverError(Error):
    pass


class NoDeviceError(Error):
    pass


class CudaError(Error):
    pass


class CompileError(Error):
    pass


class LaunchError(Error):
    pass


class RuntimePoisonedError(Error):
    pass


class BufferTooSmallError(Error):
    pass


class InternalError(Error):
    pass


class CacheError(Error):
    pass


_BY_STATUS = {
    1: InvalidArgumentError,
    2: UnsupportedError,
    3: OutOfMemoryError,
    4: NoDriverError,
    5: NoDeviceError,
    6: CudaError,
    7: CompileError,
    8: LaunchError,
    9: RuntimePoisonedError,
    10: BufferTooSmallError,
    11: InternalError,
    12: CacheError,
}


def make_error(status, message):
    return _BY_STATUS.get(int(status), Error)(status, message)


def check(status):
    """Raises the Error for a non-zero fa_status, with fa_last_error() read at
    once (it is only valid until this thread's next fa_ call)."""
    if status != _lib.SUCCESS:
        msg = _lib.lib().fa_last_error()
        msg = msg.decode("utf-8", "replace") if msg else ""
        if not msg:
            msg = _lib.lib().fa_status_string(status).decode("utf-8", "replace")
        raise make_error(status, msg)


def invalid(message):
    """An INVALID_ARGUMENT error raised by the binding's own checks."""
    return InvalidArgumentError(1, message)
