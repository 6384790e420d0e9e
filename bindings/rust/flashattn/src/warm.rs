//! Offline cache warming (fa_cache_warm, since 0.7): fill a kernel cache, with
//! no GPU or driver, with the rows a runtime on each target SM would build.
use std::any::Any;
use std::ffi::{c_void, CStr, CString};
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::path::PathBuf;

use flashattn_sys as sys;

use crate::error::{check, to_i32, Error, Result};
use crate::runtime::c_chars;

/// What to warm (fa_cache_warm_options). Build it with struct-update syntax:
///
/// ```no_run
/// # fn main() -> flashattn::Result<()> {
/// let opts = flashattn::WarmOptions {
///     sms: flashattn::parse_sms("80,90a,sm_100a")?,
///     presets: vec!["llama-3-8b".into(), "gpt-oss".into()],
///     cache_dir: Some("/opt/flashattn-cache".into()),
///     ..Default::default()
/// };
/// let counts = flashattn::cache_warm(&opts)?;
/// println!("built {}, already present {}", counts.built, counts.present);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WarmOptions {
    /// The target SMs: 80, 86, 87, 89, 90 (sm_90a kernels where the kernel
    /// takes them), 100, 103, 110, 120, 121; at least one. [`parse_sms`]
    /// reads the CLI's forms ("90a", "sm_100a").
    pub sms: Vec<i32>,
    /// Preset names ([`cache_warm_presets`]); each may itself be a
    /// comma-separated list.
    pub presets: Vec<String>,
    /// Kernel spec lines (cache/README.md, "Warming"), or None. At least one
    /// of `presets` and `specs`.
    pub specs: Option<String>,
    /// The cache directory, as `RuntimeBuilder::cache_dir`; None: the
    /// default ($FLASHATTN_CACHE_DIR, $XDG_CACHE_HOME/flashattn,
    /// ~/.cache/flashattn). It must pass the library's trust checks and be
    /// writable.
    pub cache_dir: Option<PathBuf>,
    /// Kernels compiled at once; 0 = the online CPUs.
    pub jobs: usize,
    /// true: PTX rows (the driver JIT-compiles them on first use); false:
    /// cubins from the PTX compiler plugin when one is found, else PTX rows.
    pub ptx_only: bool,
}

/// The counts of a warm call (fa_cache_warm_progress without the kernel).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WarmCounts {
    /// Distinct kernels asked for: (spec line, SM) pairs that SM runs.
    pub total: u64,
    /// Of which finished: built + present + failed.
    pub done: u64,
    /// Rows written.
    pub built: u64,
    /// Rows already there with this compiler's binary.
    pub present: u64,
    /// Kernels the compiler rejected.
    pub failed: u64,
    /// (spec line, SM) pairs that SM cannot run (an fp8 KV cache below
    /// sm_89, ...): not counted in `total`.
    pub skipped: u64,
    /// PTX + binary bytes of the rows written.
    pub bytes: u64,
    /// Wall time since the call began, in seconds.
    pub seconds: f64,
    /// What built the binaries: the PTX compiler plugin's version, or ""
    /// (PTX rows, JIT-compiled by the device's driver on first use).
    pub compiler: String,
}

/// One progress report: the counts so far and the kernel just finished.
#[derive(Debug, Clone, PartialEq)]
pub struct WarmProgress<'a> {
    pub counts: WarmCounts,
    /// The kernel, as `CacheEntry::spec`.
    pub spec: &'a str,
    /// Its SM.
    pub sm: i32,
}

impl WarmCounts {
    fn from_raw(p: &sys::fa_cache_warm_progress) -> WarmCounts {
        WarmCounts {
            total: p.total,
            done: p.done,
            built: p.built,
            present: p.present,
            failed: p.failed,
            skipped: p.skipped,
            bytes: p.bytes,
            seconds: p.seconds,
            compiler: c_chars(&p.compiler),
        }
    }
}

/// SMs from the CLI's `--sm` forms: a comma-separated list of "80", "90a",
/// "sm_100a", "120f" (the `sm_` prefix and an `a` / `f` suffix dropped).
/// Errors: InvalidArgument naming the item that is not an SM.
pub fn parse_sms(list: &str) -> Result<Vec<i32>> {
    let sms = list
        .split(',')
        .map(|item| {
            let digits = item.strip_prefix("sm_").unwrap_or(item);
            let digits = digits.strip_suffix(['a', 'f']).unwrap_or(digits);
            match digits.parse::<i32>() {
                Ok(v) if digits.len() <= 4 && digits.bytes().all(|b| b.is_ascii_digit()) => Ok(v),
                _ => Err(Error::invalid(format!(
                    "flashattn-rs: sms: '{item}' is not an SM (80, 90a, sm_100a, ...)"
                ))),
            }
        })
        .collect::<Result<Vec<i32>>>()?;
    Ok(sms)
}

fn c_string(what: &str, bytes: Vec<u8>) -> Result<CString> {
    CString::new(bytes)
        .map_err(|_| Error::invalid(format!("flashattn-rs: {what} contains a NUL byte")))
}

/// The progress closure and a panic it raised (which must not unwind into C).
struct Reporter<'f> {
    f: &'f mut dyn FnMut(&WarmProgress<'_>),
    panic: Option<Box<dyn Any + Send>>,
}

unsafe extern "C" fn report(p: *const sys::fa_cache_warm_progress, user: *mut c_void) {
    // SAFETY: user is the &mut Reporter of warm(), alive for the whole call
    // (progress runs on the calling thread, never concurrently); p is valid
    // during this call.
    let r = &mut *(user as *mut Reporter<'_>);
    if r.panic.is_some() {
        return; // it panicked before: the call runs on, unreported
    }
    let p = &*p;
    let f = &mut r.f;
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        let spec = if p.spec.is_null() {
            Default::default()
        } else {
            CStr::from_ptr(p.spec).to_string_lossy()
        };
        (*f)(&WarmProgress { counts: WarmCounts::from_raw(p), spec: &spec, sm: p.sm });
    }));
    if let Err(payload) = outcome {
        r.panic = Some(payload);
    }
}

fn warm(
    opts: &WarmOptions,
    progress: Option<&mut dyn FnMut(&WarmProgress<'_>)>,
) -> Result<WarmCounts> {
    use std::os::unix::ffi::OsStrExt;
    let num_sms = to_i32("sms.len()", opts.sms.len())?;
    let jobs = to_i32("jobs", opts.jobs)?;
    let cache_dir = match &opts.cache_dir {
        Some(d) => Some(c_string("cache_dir", d.as_os_str().as_bytes().to_vec())?),
        None => None,
    };
    let presets = if opts.presets.is_empty() {
        None
    } else {
        Some(c_string("presets", opts.presets.join(",").into_bytes())?)
    };
    let specs = match &opts.specs {
        Some(s) => Some(c_string("specs", s.clone().into_bytes())?),
        None => None,
    };
    let ptr = |s: &Option<CString>| s.as_ref().map_or(std::ptr::null(), |c| c.as_ptr());
    let mut o = sys::fa_cache_warm_options {
        cache_dir: ptr(&cache_dir),
        sms: if opts.sms.is_empty() { std::ptr::null() } else { opts.sms.as_ptr() },
        num_sms,
        jobs,
        presets: ptr(&presets),
        specs: ptr(&specs),
        ptx_compiler: if opts.ptx_only {
            sys::FA_PTX_COMPILER_OFF
        } else {
            sys::FA_PTX_COMPILER_AUTO
        },
        ..Default::default()
    };
    let mut reporter = progress.map(|f| Reporter { f, panic: None });
    if let Some(r) = reporter.as_mut() {
        o.progress = Some(report);
        o.user = (r as *mut Reporter<'_>).cast();
    }
    let mut result = sys::fa_cache_warm_progress::default();
    // SAFETY: o, the strings and sms it points to, and the reporter outlive
    // the call; result is a correctly sized out struct.
    let status = unsafe { sys::fa_cache_warm(&o, &mut result) };
    let checked = check(status); // reads fa_last_error before anything else
    if let Some(payload) = reporter.and_then(|r| r.panic) {
        resume_unwind(payload);
    }
    checked.map(|()| WarmCounts::from_raw(&result))
}

/// Fills a kernel cache, on a machine without a GPU or driver, with the rows
/// a runtime on each SM of `opts.sms` would build for the kernels the presets
/// and spec lines name (fa_cache_warm). A runtime on such a GPU (or an
/// emulator runtime with that `emulator_sm`) over the cache then compiles
/// nothing. Rows already current are left alone; kernels an SM cannot run
/// are skipped and counted. The kernel choice follows this process's
/// environment (FLASHATTN_SCALAR_FORWARD and the like), as a runtime's does.
///
/// Errors: InvalidArgument (no SM, jobs or sms beyond int32, a NUL byte in
/// a string, an unknown preset, a spec line that does not parse or that the
/// library's config / generate checks refuse: the message names the line and
/// the key), Unsupported (an SM not supported), Cache (the directory cannot
/// be used or written: nothing written), Compile (some kernels failed to
/// compile: the others are written; the message names the first).
/// Thread safety: any thread; several processes may warm one cache.
pub fn cache_warm(opts: &WarmOptions) -> Result<WarmCounts> {
    warm(opts, None)
}

/// [`cache_warm`], calling `progress` on this thread after each kernel. A
/// panic in `progress` cannot stop the C call: it is caught, `progress` is
/// not called again, the remaining kernels are warmed, then the panic resumes
/// in the caller.
pub fn cache_warm_with_progress<F>(opts: &WarmOptions, mut progress: F) -> Result<WarmCounts>
where
    F: FnMut(&WarmProgress<'_>),
{
    warm(opts, Some(&mut progress))
}

/// The built-in presets, (name, description) in the library's order
/// (fa_cache_warm_presets): Llama 3, Qwen, Mistral, Gemma 2 / 3, gpt-oss,
/// DeepSeek MLA.
pub fn cache_warm_presets() -> Vec<(String, String)> {
    // SAFETY: static, NUL-terminated, never NULL.
    let text = unsafe { CStr::from_ptr(sys::fa_cache_warm_presets()) }.to_string_lossy();
    text.lines()
        .filter_map(|line| line.split_once(':'))
        .map(|(name, description)| (name.trim().to_string(), description.trim().to_string()))
        .collect()
}

/// The spec lines of preset `name` (fa_cache_warm_preset).
/// Errors: InvalidArgument naming the presets when there is no such preset.
pub fn cache_warm_preset(name: &str) -> Result<String> {
    let c = c_string("name", name.as_bytes().to_vec())?;
    // SAFETY: c is a valid C string; the result is static text or NULL.
    let text = unsafe { sys::fa_cache_warm_preset(c.as_ptr()) };
    if text.is_null() {
        return Err(Error::from_last(sys::FA_ERROR_INVALID_ARGUMENT));
    }
    // SAFETY: non-NULL static NUL-terminated text.
    Ok(unsafe { CStr::from_ptr(text) }.to_string_lossy().into_owned())
}
