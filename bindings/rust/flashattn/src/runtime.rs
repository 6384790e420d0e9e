//! The runtime (a device binding with its kernels and cache) and device
//! memory from its allocator.
use std::ffi::{c_void, CStr, CString};
use std::path::PathBuf;
use std::ptr::NonNull;
use std::sync::Arc;

use flashattn_sys as sys;

use crate::error::{check, Error, Result};

/// Which backend a runtime uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Backend {
    /// CUDA when a device exists, else the emulator.
    #[default]
    Auto,
    /// An NVIDIA GPU through libcuda.so.1.
    Cuda,
    /// The CPU interpreter of the generated PTX.
    Emulator,
}

impl Backend {
    fn to_raw(self) -> sys::fa_backend {
        match self {
            Backend::Auto => sys::FA_BACKEND_AUTO,
            Backend::Cuda => sys::FA_BACKEND_CUDA,
            Backend::Emulator => sys::FA_BACKEND_EMULATOR,
        }
    }
}

/// Where compiled kernels are cached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum CacheMode {
    /// On disk, unless FLASHATTN_CACHE_DISABLE=1.
    #[default]
    Default,
    /// On disk (falls back to memory if the store cannot be opened).
    Disk,
    /// This process only.
    Memory,
}

impl CacheMode {
    fn to_raw(self) -> sys::fa_cache_mode {
        match self {
            CacheMode::Default => sys::FA_CACHE_DEFAULT,
            CacheMode::Disk => sys::FA_CACHE_DISK,
            CacheMode::Memory => sys::FA_CACHE_MEMORY,
        }
    }
}

/// fa_ptx_compiler: whether a cuda runtime may use the PTX compiler plugin.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PtxCompiler {
    /// The plugin when present and trusted, else the driver's JIT.
    #[default]
    Auto,
    /// Always the driver's JIT.
    Off,
}

/// Options of `Runtime::builder()`; defaults as FA_RUNTIME_OPTIONS_INIT.
#[derive(Debug, Clone, Default)]
pub struct RuntimeBuilder {
    backend: Backend,
    device: i32,
    cache_mode: CacheMode,
    cache_dir: Option<PathBuf>,
    emulator_sm: i32,
    ptx_compiler: PtxCompiler,
}

impl RuntimeBuilder {
    pub fn backend(mut self, backend: Backend) -> Self {
        self.backend = backend;
        self
    }
    /// CUDA device ordinal (cuda backend).
    pub fn device(mut self, device: i32) -> Self {
        self.device = device;
        self
    }
    pub fn cache_mode(mut self, mode: CacheMode) -> Self {
        self.cache_mode = mode;
        self
    }
    /// Cache directory; unset: $FLASHATTN_CACHE_DIR, $XDG_CACHE_HOME/flashattn,
    /// ~/.cache/flashattn.
    pub fn cache_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.cache_dir = Some(dir.into());
        self
    }
    /// SM the emulator targets (80, 86, 87, 89, 90, 100, 103, 110, 120, 121); 0 = 80.
    pub fn emulator_sm(mut self, sm: i32) -> Self {
        self.emulator_sm = sm;
        self
    }
    /// PTX -> machine code on the cuda backend (since 0.6); default Auto.
    pub fn ptx_compiler(mut self, mode: PtxCompiler) -> Self {
        self.ptx_compiler = mode;
        self
    }

    /// Creates the runtime (fa_runtime_create).
    pub fn build(self) -> Result<Runtime> {
        use std::os::unix::ffi::OsStrExt;
        let dir = match &self.cache_dir {
            Some(d) => Some(
                CString::new(d.as_os_str().as_bytes())
                    .map_err(|_| Error::invalid("flashattn-rs: cache_dir contains a NUL byte"))?,
            ),
            None => None,
        };
        let opts = sys::fa_runtime_options {
            backend: self.backend.to_raw(),
            device: self.device,
            cache_mode: self.cache_mode.to_raw(),
            cache_dir: dir.as_ref().map_or(std::ptr::null(), |d| d.as_ptr()),
            emulator_sm: self.emulator_sm,
            ptx_compiler: match self.ptx_compiler {
                PtxCompiler::Auto => sys::FA_PTX_COMPILER_AUTO,
                PtxCompiler::Off => sys::FA_PTX_COMPILER_OFF,
            },
            ..Default::default()
        };
        let mut rt = std::ptr::null_mut();
        // SAFETY: opts and its cache_dir string outlive the call; rt is an out pointer.
        check(unsafe { sys::fa_runtime_create(&opts, &mut rt) })?;
        let raw = NonNull::new(rt).ok_or_else(|| {
            Error::new(crate::Status::Internal, "fa_runtime_create returned NULL")
        })?;
        Ok(Runtime { inner: Arc::new(Inner { raw }) })
    }
}

/// Owns the C handle; destroyed when the last Runtime clone and the last
/// DeviceBuffer of it are gone (so memory is always freed before destroy).
#[derive(Debug)]
pub(crate) struct Inner {
    raw: NonNull<sys::fa_runtime>,
}

// SAFETY: the C API allows every runtime call from any thread concurrently,
// except fa_runtime_destroy, which only Drop of the last owner calls.
unsafe impl Send for Inner {}
unsafe impl Sync for Inner {}

impl Drop for Inner {
    fn drop(&mut self) {
        // SAFETY: the handle came from fa_runtime_create and nothing else uses it now.
        unsafe { sys::fa_runtime_destroy(self.raw.as_ptr()) }
    }
}

/// A flashattn runtime: a CUDA device (or the emulator), its loaded kernels
/// and its kernel cache. Cloning is cheap and shares the same runtime;
/// it may be used from many threads at once.
///
/// # Closing while in use
///
/// `fa_runtime_destroy` must not run while another call uses the runtime.
/// The types rule that out without a lock: every call borrows `&self`, the
/// C handle is destroyed only when the last clone *and* the last
/// [`DeviceBuffer`] of the runtime are dropped (they share one `Arc`), and a
/// value cannot be dropped while it is borrowed. Dropping one clone while
/// other threads call through theirs is fine. What the borrow checker
/// refuses, dropping a runtime that another thread is using:
///
/// ```compile_fail,E0505
/// use flashattn::{Backend, Runtime};
/// let rt = Runtime::builder().backend(Backend::Emulator).build().unwrap();
/// std::thread::scope(|s| {
///     s.spawn(|| rt.info());
///     drop(rt); // error[E0505]: cannot move out of `rt` because it is borrowed
/// });
/// ```
///
/// The same program with the drop after the threads have finished compiles:
///
/// ```no_run
/// use flashattn::{Backend, Runtime};
/// let rt = Runtime::builder().backend(Backend::Emulator).build().unwrap();
/// std::thread::scope(|s| {
///     s.spawn(|| rt.info());
/// });
/// drop(rt);
/// ```
#[derive(Debug, Clone)]
pub struct Runtime {
    pub(crate) inner: Arc<Inner>,
}

/// What `Runtime::info` reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeInfo {
    /// The backend in use (`Backend::Cuda` or `Backend::Emulator`).
    pub backend: Backend,
    /// The raw fa_backend value (differs from `backend` only for unknown codes).
    pub backend_code: i32,
    /// Compute capability * 10 + minor (80, 90, ...).
    pub sm: i32,
    pub num_sms: i32,
    /// cuDriverGetVersion, 0 on the emulator.
    pub driver_version: i32,
    pub device_name: String,
}

/// A C char array holding a NUL-terminated string, as a String.
pub(crate) fn c_chars(chars: &[std::ffi::c_char]) -> String {
    let bytes: Vec<u8> = chars.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

impl Runtime {
    /// A runtime with default options (backend auto).
    pub fn new() -> Result<Runtime> {
        RuntimeBuilder::default().build()
    }

    /// Options for a new runtime.
    pub fn builder() -> RuntimeBuilder {
        RuntimeBuilder::default()
    }

    /// The C handle, for calls through flashattn-sys. Valid while self lives.
    pub fn as_raw(&self) -> *mut sys::fa_runtime {
        self.inner.raw.as_ptr()
    }

    /// Device and backend description (fa_runtime_get_info).
    pub fn info(&self) -> Result<RuntimeInfo> {
        let mut info = sys::fa_runtime_info::default();
        // SAFETY: valid handle and a correctly sized out struct.
        check(unsafe { sys::fa_runtime_get_info(self.as_raw(), &mut info) })?;
        let backend = match info.backend {
            sys::FA_BACKEND_CUDA => Backend::Cuda,
            sys::FA_BACKEND_EMULATOR => Backend::Emulator,
            _ => Backend::Auto,
        };
        Ok(RuntimeInfo {
            backend,
            backend_code: info.backend,
            sm: info.sm,
            num_sms: info.num_sms,
            driver_version: info.driver_version,
            device_name: c_chars(&info.device_name),
        })
    }

    /// Allocates `bytes` (> 0) of device memory, 256-byte aligned, freed on Drop.
    pub fn alloc(&self, bytes: usize) -> Result<DeviceBuffer> {
        let mut ptr = 0u64;
        // SAFETY: valid handle; ptr is an out pointer.
        check(unsafe { sys::fa_malloc(self.as_raw(), bytes, &mut ptr) })?;
        Ok(DeviceBuffer { rt: self.inner.clone(), ptr, bytes })
    }

    /// Allocates a buffer holding a copy of `data`.
    pub fn alloc_from<T: Element>(&self, data: &[T]) -> Result<DeviceBuffer> {
        let mut buf = self.alloc(std::mem::size_of_val(data).max(1))?;
        buf.upload(data)?;
        Ok(buf)
    }

    /// Waits for all work on the default stream (fa_synchronize).
    pub fn synchronize(&self) -> Result<()> {
        // SAFETY: valid handle; NULL is the legacy default stream.
        check(unsafe { sys::fa_synchronize(self.as_raw(), std::ptr::null_mut()) })
    }

    /// Waits for all work on `stream` (a CUstream).
    ///
    /// # Safety
    /// `stream` must be NULL or a live CUstream of this runtime's context.
    pub unsafe fn synchronize_stream(&self, stream: *mut c_void) -> Result<()> {
        check(sys::fa_synchronize(self.as_raw(), stream))
    }

    /// The identity of this runtime, to check that a buffer belongs to it.
    pub(crate) fn id(&self) -> usize {
        Arc::as_ptr(&self.inner) as usize
    }
}

/// Plain element types that can be copied to and from device memory.
/// Sealed: implemented for u8, u16 (fp16/bf16 bits), i32, u32, u64 (device
/// addresses), f32.
pub trait Element: Copy + Default + sealed::Sealed + 'static {}
mod sealed {
    pub trait Sealed {}
}
macro_rules! element {
    ($($t:ty),*) => { $( impl sealed::Sealed for $t {} impl Element for $t {} )* };
}
element!(u8, u16, i32, u32, u64, f32);

/// Device memory from `Runtime::alloc`; `Drop` returns it with fa_free. Keeps
/// its runtime alive.
///
/// A buffer cannot be freed while a call reads or writes it: the safe calls
/// borrow it through [`Tensor`](crate::Tensor) / [`TensorMut`](crate::TensorMut)
/// views for their whole length.
///
/// ```compile_fail,E0505
/// use flashattn::{Backend, Runtime, Tensor};
/// let rt = Runtime::builder().backend(Backend::Emulator).build().unwrap();
/// let buf = rt.alloc(4096).unwrap();
/// let q = Tensor::contiguous(&buf, [1, 16, 2, 32]);
/// drop(buf); // error[E0505]: cannot move out of `buf` because it is borrowed
/// let _still_used = q;
/// ```
///
/// ```no_run
/// use flashattn::{Backend, Runtime, Tensor};
/// let rt = Runtime::builder().backend(Backend::Emulator).build().unwrap();
/// let buf = rt.alloc(4096).unwrap();
/// let q = Tensor::contiguous(&buf, [1, 16, 2, 32]);
/// let _still_used = q;
/// drop(buf);
/// ```
#[derive(Debug)]
pub struct DeviceBuffer {
    rt: Arc<Inner>,
    ptr: u64,
    bytes: usize,
}

impl DeviceBuffer {
    /// The device address (CUdeviceptr).
    pub fn as_ptr(&self) -> u64 {
        self.ptr
    }
    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.bytes
    }
    pub fn is_empty(&self) -> bool {
        self.bytes == 0
    }
    pub(crate) fn runtime_id(&self) -> usize {
        Arc::as_ptr(&self.rt) as usize
    }

    fn range(&self, byte_offset: usize, bytes: usize, what: &str) -> Result<()> {
        match byte_offset.checked_add(bytes) {
            Some(end) if end <= self.bytes => Ok(()),
            _ => Err(Error::invalid(format!(
                "flashattn-rs: {what} of {bytes} bytes at offset {byte_offset} exceeds the \
                 {}-byte buffer",
                self.bytes
            ))),
        }
    }

    /// Copies `data` to the start of the buffer.
    pub fn upload<T: Element>(&mut self, data: &[T]) -> Result<()> {
        self.upload_at(0, data)
    }

    /// Copies `data` into the buffer at `byte_offset`.
    pub fn upload_at<T: Element>(&mut self, byte_offset: usize, data: &[T]) -> Result<()> {
        let bytes = std::mem::size_of_val(data);
        self.range(byte_offset, bytes, "upload")?;
        // SAFETY: the range lies in this allocation; data is readable for bytes.
        check(unsafe {
            sys::fa_memcpy_htod(
                self.rt.raw.as_ptr(),
                self.ptr + byte_offset as u64,
                data.as_ptr().cast(),
                bytes,
            )
        })
    }

    /// Fills `out` from the start of the buffer.
    pub fn download<T: Element>(&self, out: &mut [T]) -> Result<()> {
        self.download_at(0, out)
    }

    /// Fills `out` from the buffer at `byte_offset`.
    pub fn download_at<T: Element>(&self, byte_offset: usize, out: &mut [T]) -> Result<()> {
        let bytes = std::mem::size_of_val(out);
        self.range(byte_offset, bytes, "download")?;
        // SAFETY: the range lies in this allocation; out is writable for bytes
        // and every bit pattern is a valid T.
        check(unsafe {
            sys::fa_memcpy_dtoh(
                self.rt.raw.as_ptr(),
                out.as_mut_ptr().cast(),
                self.ptr + byte_offset as u64,
                bytes,
            )
        })
    }

    /// The whole buffer as `len() / size_of::<T>()` elements.
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        let mut v = vec![T::default(); self.bytes / std::mem::size_of::<T>()];
        self.download(&mut v)?;
        Ok(v)
    }

    /// Sets every byte to `value`.
    pub fn fill_bytes(&mut self, value: u8) -> Result<()> {
        // SAFETY: the whole allocation.
        check(unsafe { sys::fa_memset(self.rt.raw.as_ptr(), self.ptr, value, self.bytes) })
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        // SAFETY: ptr came from fa_malloc on this runtime, which is still alive.
        // A failure (e.g. a CUDA context lost to an earlier fault) cannot be
        // reported from Drop and must not panic here; the memory is gone with
        // the context anyway.
        let _ = unsafe { sys::fa_free(self.rt.raw.as_ptr(), self.ptr) };
    }
}

/// The loaded library's version text ("0.9.0").
pub fn version_string() -> &'static str {
    // SAFETY: a static NUL-terminated string.
    unsafe { CStr::from_ptr(sys::fa_version_string()) }.to_str().unwrap_or("?")
}

/// The loaded library's MAJOR * 10000 + MINOR * 100 + PATCH.
pub fn version_number() -> u32 {
    // SAFETY: no arguments.
    unsafe { sys::fa_version_number() }
}
