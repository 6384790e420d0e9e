//! Status codes and the error type: every failed C call becomes an `Error`
//! holding the status and the thread's detailed message, copied at once.
use std::ffi::CStr;
use std::fmt;

use flashattn_sys as sys;

/// An `fa_status` other than success. Codes the bindings do not know (a newer
/// library) are kept as `Other(code)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Status {
    InvalidArgument,
    Unsupported,
    OutOfMemory,
    NoDriver,
    NoDevice,
    Cuda,
    Compile,
    Launch,
    RuntimePoisoned,
    BufferTooSmall,
    Internal,
    Cache,
    Other(i32),
}

impl Status {
    /// The status for a non-zero C code.
    pub fn from_code(code: i32) -> Status {
        match code {
            sys::FA_ERROR_INVALID_ARGUMENT => Status::InvalidArgument,
            sys::FA_ERROR_UNSUPPORTED => Status::Unsupported,
            sys::FA_ERROR_OUT_OF_MEMORY => Status::OutOfMemory,
            sys::FA_ERROR_NO_DRIVER => Status::NoDriver,
            sys::FA_ERROR_NO_DEVICE => Status::NoDevice,
            sys::FA_ERROR_CUDA => Status::Cuda,
            sys::FA_ERROR_COMPILE => Status::Compile,
            sys::FA_ERROR_LAUNCH => Status::Launch,
            sys::FA_ERROR_RUNTIME_POISONED => Status::RuntimePoisoned,
            sys::FA_ERROR_BUFFER_TOO_SMALL => Status::BufferTooSmall,
            sys::FA_ERROR_INTERNAL => Status::Internal,
            sys::FA_ERROR_CACHE => Status::Cache,
            c => Status::Other(c),
        }
    }

    /// The C code of this status.
    pub fn code(self) -> i32 {
        match self {
            Status::InvalidArgument => sys::FA_ERROR_INVALID_ARGUMENT,
            Status::Unsupported => sys::FA_ERROR_UNSUPPORTED,
            Status::OutOfMemory => sys::FA_ERROR_OUT_OF_MEMORY,
            Status::NoDriver => sys::FA_ERROR_NO_DRIVER,
            Status::NoDevice => sys::FA_ERROR_NO_DEVICE,
            Status::Cuda => sys::FA_ERROR_CUDA,
            Status::Compile => sys::FA_ERROR_COMPILE,
            Status::Launch => sys::FA_ERROR_LAUNCH,
            Status::RuntimePoisoned => sys::FA_ERROR_RUNTIME_POISONED,
            Status::BufferTooSmall => sys::FA_ERROR_BUFFER_TOO_SMALL,
            Status::Internal => sys::FA_ERROR_INTERNAL,
            Status::Cache => sys::FA_ERROR_CACHE,
            Status::Other(c) => c,
        }
    }

    /// The library's static text for this status ("invalid argument").
    pub fn as_str(self) -> &'static str {
        // SAFETY: fa_status_string never returns NULL and its strings are static.
        unsafe { CStr::from_ptr(sys::fa_status_string(self.code())) }
            .to_str()
            .unwrap_or("unknown status")
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A failed flashattn call: the status and the detailed message
/// ("fa_launch: q.stride[3] must be 1, got 2"). Checks done by these bindings
/// themselves use messages prefixed with "flashattn-rs".
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    pub status: Status,
    pub message: String,
}

impl Error {
    /// An error raised by the Rust layer (never reaches C).
    pub(crate) fn new(status: Status, message: impl Into<String>) -> Error {
        Error { status, message: message.into() }
    }

    pub(crate) fn invalid(message: impl Into<String>) -> Error {
        Error::new(Status::InvalidArgument, message)
    }

    /// The error for C status `code`, with the calling thread's
    /// fa_last_error() text. Must be called right after the failing call.
    pub(crate) fn from_last(code: i32) -> Error {
        // SAFETY: fa_last_error returns a valid NUL-terminated thread-local
        // string; it is copied before any other fa_ call on this thread.
        let message =
            unsafe { CStr::from_ptr(sys::fa_last_error()) }.to_string_lossy().into_owned();
        Error { status: Status::from_code(code), message }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.message.is_empty() {
            write!(f, "flashattn: {}", self.status)
        } else {
            write!(f, "{} ({})", self.message, self.status)
        }
    }
}

impl std::error::Error for Error {}

/// The result of every fallible call.
pub type Result<T> = std::result::Result<T, Error>;

/// Maps a C status to `Ok(())` or the thread's last error.
pub(crate) fn check(code: sys::fa_status) -> Result<()> {
    if code == sys::FA_SUCCESS {
        Ok(())
    } else {
        Err(Error::from_last(code))
    }
}

/// An int32 field of the C API from a Rust size.
pub(crate) fn to_i32(name: &str, v: usize) -> Result<i32> {
    i32::try_from(v)
        .map_err(|_| Error::invalid(format!("flashattn-rs: {name} = {v} does not fit in int32")))
}
